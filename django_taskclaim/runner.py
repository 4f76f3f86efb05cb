"""``run_once``: claim, keep alive, run, store the result — or return the stored one."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .claims import Claim, claim
from .conf import settings
from .exceptions import StaleClaim, TaskBusy, TaskFailed
from .keys import TaskKey

logger = logging.getLogger("django_taskclaim")

ON_BUSY = ("raise", "wait")


def run_claimed(claim_: Claim, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``func`` under ``claim_`` with keepalive and store its result.

    If ``func`` raises, the failure is recorded with ``retry=True`` (PENDING while attempts
    remain) and the exception propagates. If the claim was fenced off meanwhile, nothing is
    stored and ``StaleClaim`` propagates.
    """
    try:
        with claim_.keepalive():
            result = func(*args, **kwargs)
    except StaleClaim:
        raise
    except Exception as exc:
        try:
            claim_.fail(exc, retry=True)
        except StaleClaim:
            logger.warning("failure of a fenced-off claim not recorded",
                           extra={"key": claim_.key, "tenant": claim_.tenant, "token": claim_.token})
        raise
    claim_.complete(result)
    return result


def run_once(
    key: str | TaskKey, func: Callable[..., Any], *args: Any, tenant: str = "", payload: Any = None,
    lease: float | timedelta | None = None, on_busy: str = "raise", **kwargs: Any,
) -> Any:
    """Run ``func(*args, **kwargs)`` at most once for ``(tenant, key)`` and return its result.

    A duplicate call after success returns the stored result without running ``func``. While
    another worker runs it, ``on_busy="raise"`` raises ``TaskBusy`` and ``on_busy="wait"``
    polls until it ends (taking it over if its owner's lease expires). A task that ended
    FAILED or CANCELLED raises ``TaskFailed``.
    """
    from .models import Task

    if on_busy not in ON_BUSY:
        raise ValueError(f"on_busy must be one of {ON_BUSY}, not {on_busy!r}")
    while True:
        outcome = claim(key, tenant=tenant, lease=lease, payload=payload)
        if outcome.claim is not None:
            return run_claimed(outcome.claim, func, *args, **kwargs)
        task = outcome.task
        if task.status == Task.Status.SUCCEEDED:
            return task.result
        if task.status in (Task.Status.FAILED, Task.Status.CANCELLED):
            raise TaskFailed(task)
        if on_busy == "raise":
            raise TaskBusy(task)
        _wait_while_busy(task)


def _wait_while_busy(task: Any) -> None:
    """Poll until the task is no longer held under a live lease."""
    from .backends import DbNow
    from .models import Task

    interval = settings.POLL_INTERVAL
    while True:
        time.sleep(interval)  # polling the database is the point here, not a synchronisation shortcut
        live = Task.objects.using(task._state.db).filter(
            pk=task.pk, status=Task.Status.RUNNING, lease_expires_at__gte=DbNow()).exists()
        if not live:
            return
