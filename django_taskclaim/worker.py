"""A queue worker: claim the next tasks, run a handler on each, store its result.

The loop costs one commit per task: the completion of a task and the claim of the next are
one statement (:meth:`Claim.complete_and_claim_next`). Each handler call runs under
``keepalive()``. A handler's exception is recorded with ``retry=True`` (the task comes back
while attempts remain); a result that cannot be stored ends its task FAILED, never running
it again; a claim fenced off meanwhile (its lease expired and another worker took over)
stores nothing. A handler may end its claim itself (publish its work and complete it in
one ``claim.fenced()`` block of its own, say): the worker then stores nothing more.

    from django_taskclaim.worker import work

    def handle(claim):               # claim.key, claim.tenant, claim.payload
        return render_report(claim.payload)

    work(handle, lease=60, batch=10, stop=stop_event)

or ``manage.py taskclaim_worker myapp.jobs.handle``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DataError, close_old_connections

from .conf import settings
from .exceptions import InvalidResult, StaleClaim
from .keys import lease_seconds, positive_int
from .lifecycle import Claim, claim_next, default_owner
from .models import Task
from .status import Status

logger = logging.getLogger("django_taskclaim")

Handler = Callable[[Claim], Any]


@dataclass
class WorkerStats:
    """What one :func:`work` call did."""

    succeeded: int = 0
    failed: int = 0
    fenced_off: int = 0

    @property
    def handled(self) -> int:
        return self.succeeded + self.failed + self.fenced_off


def work(
    handler: Handler, *, owner: str | None = None, lease: float | timedelta | None = None,
    tenant: str | None = None, batch: int = 1, poll: float | None = None, max_tasks: int | None = None,
    until_drained: bool = False, atomic: bool = False, stop: threading.Event | None = None,
    using: str | None = None,
) -> WorkerStats:
    """Run ``handler(claim)`` on queued tasks until ``stop`` is set (or idle, or ``max_tasks``).

    ``batch`` tasks are claimed at a time; the last completion of a batch claims the next one.
    A claim that waited its turn longer than ``lease / 3`` is renewed before its handler runs
    (and skipped, counted as fenced off, if another worker took it over meanwhile).
    ``until_drained`` stops once no task is unfinished (one held by another worker may come back).
    With no task to claim the worker waits ``poll`` seconds (``TASKCLAIM_POLL_INTERVAL``).
    ``atomic=True`` runs each handler inside ``claim.fenced()`` and completes it there: its
    database writes commit with the completion, once, or not at all.
    """
    seconds = lease_seconds(lease)
    positive_int(batch, "batch")
    if max_tasks is not None:
        positive_int(max_tasks, "max_tasks")
    owner = owner or default_owner()
    stop = stop or threading.Event()
    wait = settings.POLL_INTERVAL if poll is None else poll
    stats = WorkerStats()
    claims: list[Claim] = []
    received = 0.0  # when the claims in hand were made, by this process's monotonic clock
    while not stop.is_set():
        if not claims:
            close_old_connections()
            claims = claim_next(owner, seconds, tenant, _room(batch, max_tasks, stats), using=using)
            received = time.monotonic()
            if not claims:
                if until_drained and not _unfinished(tenant, using):
                    break
                stop.wait(wait)
                continue
        claim = claims.pop(0)
        if _still_ours(claim, received, stats):
            more = 0 if claims or stop.is_set() else _room(batch, max_tasks, stats, after=1)
            got = _run(handler, claim, stats, more, tenant, atomic)
            if got:
                claims, received = got, time.monotonic()
        if max_tasks is not None and stats.handled >= max_tasks:
            break
    for left in claims:  # stopped with claims in hand: give them back untouched
        with suppress(StaleClaim):
            left.release()
    return stats


def _still_ours(claim: Claim, received: float, stats: WorkerStats) -> bool:
    """Whether a claim of a batch may run now: one that waited its turn longer than a heartbeat
    interval (``lease / 3``) is renewed first, so that a task whose lease ran out meanwhile (and
    that another worker may have taken over) is never run here as well."""
    if time.monotonic() - received <= claim.lease / 3:
        return True  # its lease, stamped before the claim returned, has two thirds left at least
    try:
        claim.heartbeat()
    except StaleClaim:
        stats.fenced_off += 1
        return False
    return True


def _unfinished(tenant: str | None, using: str | None) -> bool:
    """Whether any task (of ``tenant``) is still pending or running: held elsewhere, it may come back."""
    tasks = Task.objects.db_manager(using).unfinished() if using else Task.objects.unfinished()
    return (tasks.filter(tenant=tenant) if tenant is not None else tasks).exists()


def _room(batch: int, max_tasks: int | None, stats: WorkerStats, after: int = 0) -> int:
    """How many tasks to claim next: a batch, or what is left of ``max_tasks``."""
    if max_tasks is None:
        return batch
    return max(0, min(batch, max_tasks - stats.handled - after))


def _run(
    handler: Handler, claim: Claim, stats: WorkerStats, more: int, tenant: str | None, atomic: bool,
) -> list[Claim]:
    """Run one task; returns the claims its completion made (``more`` of them at most)."""
    try:
        with claim.keepalive():
            if atomic:
                # The handler's own writes, the completion and the next claims commit together,
                # and only while this claim owns the task: the exactly-once recipe of fenced().
                with claim.fenced():
                    return _counted(stats, claim, _finish(claim, handler(claim), more, tenant))
            result = handler(claim)
        return _counted(stats, claim, _finish(claim, result, more, tenant))
    except StaleClaim:
        stats.fenced_off += 1
    except (InvalidResult, DataError) as exc:
        # The work ran but its result cannot be stored: the task ends FAILED, never run again.
        _fail(claim, exc, retry=False, stats=stats)
    except Exception as exc:
        logger.warning("task handler failed", exc_info=True, extra=claim._log_extra())
        _fail(claim, exc, retry=True, stats=stats)
    return []


def _finish(claim: Claim, result: Any, more: int, tenant: str | None) -> list[Claim]:
    if claim._ended is not None:
        return []  # the handler completed (or failed, or released) its claim itself
    if more:
        return claim.complete_and_claim_next(result, limit=more, tenant=tenant)
    claim.complete(result)
    return []


def _counted(stats: WorkerStats, claim: Claim, claims: list[Claim]) -> list[Claim]:
    """Count a task that ran to its end: failed only if the handler itself failed or released it."""
    if claim._ended in (None, Status.SUCCEEDED):
        stats.succeeded += 1
    else:
        stats.failed += 1
    return claims


def _fail(claim: Claim, error: BaseException, *, retry: bool, stats: WorkerStats) -> None:
    try:
        claim.fail(error, retry=retry)
    except StaleClaim:
        stats.fenced_off += 1
    else:
        stats.failed += 1
