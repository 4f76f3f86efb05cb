"""``run_once``: claim, keep alive, run, store the result — or return the stored one."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Any

from django.db import transaction

from .conf import settings
from .exceptions import StaleClaim, TaskBusy, TaskFailed
from .keys import TaskKey
from .lifecycle import Claim, claim, complete_or_fail, in_transaction
from .models import Task
from .status import Status

logger = logging.getLogger("django_taskclaim")

ON_BUSY = ("raise", "wait")


def _savepoint(claim_: Claim) -> AbstractContextManager[Any]:
    # Inside a transaction a database error in ``func`` would abort it (PostgreSQL), and then
    # recording the failure would fail too, hiding the original error: run ``func`` in a
    # savepoint, so its rollback leaves the transaction usable. Outside one, ``func`` runs as is.
    return transaction.atomic(using=claim_.using) if in_transaction(claim_.using) else nullcontext()


def run_claimed(claim_: Claim, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run ``func`` under ``claim_`` with keepalive and store its result.

    If ``func`` raises, the failure is recorded with ``retry=True`` (PENDING while attempts
    remain) and the exception propagates. If the claim was fenced off meanwhile, nothing is
    stored and ``StaleClaim`` propagates. If the result cannot be stored, the task ends FAILED
    and ``InvalidResult`` propagates: the work never runs again.
    """
    try:
        with claim_.keepalive(), _savepoint(claim_):
            result = func(*args, **kwargs)
    except StaleClaim:
        raise
    except Exception as exc:
        try:
            claim_.fail(exc, retry=True)
        except StaleClaim:
            logger.warning("failure of a fenced-off claim not recorded", extra=claim_._log_extra())
        raise
    complete_or_fail(claim_, result)
    return result


def run_once(
    key: str | TaskKey, func: Callable[..., Any], /, *args: Any, tenant: str = "", payload: Any = None,
    lease: float | timedelta | None = None, on_busy: str = "raise", **kwargs: Any,
) -> Any:
    """Run ``func(*args, **kwargs)`` at most once for ``(tenant, key)`` and return its result.

    A duplicate call after success returns the stored result without running ``func``. While
    another worker runs it, ``on_busy="raise"`` raises ``TaskBusy`` and ``on_busy="wait"``
    polls until it ends (taking it over if its owner's lease expires). A task that ended
    FAILED or CANCELLED raises ``TaskFailed``.

    ``key`` and ``func`` are positional-only, so ``func`` may take keywords named ``key`` or
    ``func``; ``tenant``, ``payload``, ``lease`` and ``on_busy`` belong to ``run_once``. To
    pass keywords of those names to ``func``, use :func:`run_once_with`.
    """
    return _run_once(key, tenant, payload, lease, on_busy, func, args, kwargs)


def run_once_with(
    key: str | TaskKey, *, tenant: str = "", payload: Any = None, lease: float | timedelta | None = None,
    on_busy: str = "raise",
) -> Callable[..., Any]:
    """:func:`run_once` with its options given first: every argument of the returned call goes to ``func``.

    ``run_once_with(key, tenant="acme")(func, *args, **kwargs)``: no keyword of ``func``
    (``tenant``, ``payload``, ``lease``, ``on_busy``, ``key``) can collide with an option.
    """
    if on_busy not in ON_BUSY:
        raise ValueError(f"on_busy must be one of {ON_BUSY}, not {on_busy!r}")

    def call(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return _run_once(key, tenant, payload, lease, on_busy, func, args, kwargs)

    return call


def _run_once(
    key: str | TaskKey, tenant: str, payload: Any, lease: float | timedelta | None, on_busy: str,
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
) -> Any:

    if on_busy not in ON_BUSY:
        raise ValueError(f"on_busy must be one of {ON_BUSY}, not {on_busy!r}")
    task = None
    while True:
        if task is None or not task.is_terminal:
            outcome = claim(key, tenant=tenant, lease=lease, payload=payload)
            if outcome.claim is not None:
                return run_claimed(outcome.claim, func, *args, **kwargs)
            task = outcome.task
        answer = stored_answer(task, on_busy)
        if answer is not WAIT:
            return answer
        # Wait, then look at the task: a finished one is answered without another claim, so a
        # waiting caller leaves one ``duplicate`` audit row, not one per poll.
        task = _wait_while_busy(task)


WAIT = object()


def stored_answer(task: Any, on_busy: str) -> Any:
    """What a caller that did not claim ``task`` gets: its stored result, ``TaskFailed``,
    ``TaskBusy`` (``on_busy="raise"``), or ``WAIT`` to poll until the owner is done."""
    if task.status == Status.SUCCEEDED:
        return task.result
    if task.status in (Status.FAILED, Status.CANCELLED):
        raise TaskFailed(task)
    if on_busy == "raise":
        raise TaskBusy(task)
    return WAIT


def _wait_while_busy(task: Any) -> Any:
    """Poll until the task is no longer held under a live lease; its state then (``None`` if purged)."""
    interval = settings.POLL_INTERVAL
    tasks = Task.objects.using(task._state.db)
    while True:
        time.sleep(interval)  # polling the database is the point here, not a synchronisation shortcut
        live = tasks.filter(pk=task.pk).live().exists()
        if not live:
            return tasks.filter(pk=task.pk).first()
