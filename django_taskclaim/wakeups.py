"""How an idle queue worker waits for work: woken by the enqueue's commit where the database can
say so, else by its poll interval.

On PostgreSQL migration 0006's triggers ``NOTIFY`` a channel when a queued task becomes PENDING
(enqueued, retried, released, reset by an operator), and :func:`wait_for_work` ``LISTEN``\\s on
a connection of its own (:mod:`django_taskclaim.store.listening`), so a task enqueued on an idle
system starts within milliseconds. A notification is a hint, never the hand-out: the worker
then claims with its one statement, which alone decides who runs what; a notification lost (the
listening connection dropped, a transaction-mode pooler) costs at most one poll interval, after
which the worker looks anyway. A task enqueued not due yet is announced with the seconds until
it is due, and the wait ends then. MySQL/MariaDB and SQLite have no such channel: there the
worker looks every ``TASKCLAIM_POLL_INTERVAL`` seconds.

One listening connection per task database and per thread that waits (a worker's lane), opened
at its first wait and opened again after it is lost.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence

from django.db import OperationalError
from django.db.models import DurationField, ExpressionWrapper, F, Min

from .models import Task
from .store import DbNow, listening

logger = logging.getLogger("django_taskclaim")

#: How often a wait on a listening connection looks at ``stop`` (a ``threading.Event`` cannot be
#: waited for together with a socket).
STOP_CHECK = 0.1
#: After a listening connection could not be opened, how long the worker polls before trying again.
RECONNECT_AFTER = 5.0

_local = threading.local()


def wait_for_work(alias: str, queues: Sequence[str], timeout: float, stop: threading.Event) -> bool:
    """Wait until a task of ``queues`` may be claimable in task database ``alias``: a notification
    of one (PostgreSQL), the time a task known to be deferred becomes due, ``stop`` set, or
    ``timeout`` seconds (the poll interval) passed. True when the worker should look now because
    of something it heard (or may have missed: a listening connection just opened), False when
    the time ran out or ``stop`` was set."""
    if not listening.can_listen(alias):
        stop.wait(timeout)
        return False
    wakers: dict[str, _Waker] = _local.__dict__.setdefault("wakers", {})
    waker = wakers.get(alias)
    if waker is None:
        waker = wakers[alias] = _Waker(alias)
    return waker.wait(set(queues), timeout, stop)


def close() -> None:
    """Close this thread's listening connections (a worker thread that ends)."""
    for waker in _local.__dict__.pop("wakers", {}).values():
        waker.drop()


class _Waker:
    """One thread's wake-ups from one task database: its listening connection, and the times it
    heard that deferred tasks become due."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.listener: listening.Listener | None = None
        self.retry_at = 0.0  # monotonic time of the next try to open a listening connection
        self.lost = False  # said once per loss, not on every failed try
        self.due: dict[str, float] = {}  # queue -> monotonic time its earliest deferred task is due

    def wait(self, queues: set[str], timeout: float, stop: threading.Event) -> bool:
        now = time.monotonic()
        self.due = {queue: at for queue, at in self.due.items() if at > now}  # the ones passed were looked for
        deadline = now + timeout
        if self.listener is None:
            if now < self.retry_at or not self.open(queues):
                return self.poll(queues, deadline, stop)
            return True  # notifications sent before LISTEN were not heard: look once more
        try:
            while not stop.is_set():
                due = min((self.due[q] for q in queues if q in self.due), default=deadline)
                left = min(deadline, due) - time.monotonic()
                if self.heard(self.listener.receive(max(0.0, min(left, STOP_CHECK))), queues):
                    return True
                if time.monotonic() >= due:
                    return due < deadline  # a deferred task is due now; else the poll interval ran out
        except OperationalError as exc:
            self.drop()
            logger.warning("%s: reconnecting", exc, extra={"database": self.alias})
            self.lost = True
            if self.open(queues):
                return True
            return self.poll(queues, deadline, stop)
        return False

    def heard(self, payloads: list[str], queues: set[str]) -> bool:
        """Whether ``payloads`` announce a task of ``queues`` due now (deferred ones are noted)."""
        wake = False
        for payload in payloads:
            found = listening.parse(payload)
            if found is None or found[0] not in queues:
                continue
            queue, due_in = found
            if due_in is None:
                wake = True
            else:
                self.note({queue}, due_in)
        return wake

    def note(self, queues: set[str], due_in: float | None) -> None:
        """A task of ``queues`` is due in ``due_in`` seconds (None: no news)."""
        if due_in is not None:
            at = time.monotonic() + due_in
            for queue in queues:
                self.due[queue] = min(self.due.get(queue, at), at)

    def poll(self, queues: set[str], deadline: float, stop: threading.Event) -> bool:
        """Without a listening connection: wait for the poll interval (or a deferred task known to be due)."""
        due = min((self.due[q] for q in queues if q in self.due), default=deadline)
        if stop.wait(max(0.0, min(deadline, due) - time.monotonic())):
            return False
        return due < deadline

    def open(self, queues: set[str]) -> bool:
        """Open the listening connection, and learn when the tasks deferred before it are due (no
        notification will say); False (and poll until the next try) if it cannot be done."""
        try:
            self.listener = listening.Listener(self.alias)
            self.note(queues, _soonest(self.alias, queues))
        except OperationalError as exc:
            self.drop()
            if not self.lost:
                logger.warning("%s; polling, trying again in %g s", exc, RECONNECT_AFTER,
                               extra={"database": self.alias})
            self.lost = True
            self.retry_at = time.monotonic() + RECONNECT_AFTER
            return False
        if self.lost:
            logger.info("wake-ups of database %r heard again", self.alias, extra={"database": self.alias})
        self.lost = False
        return True

    def __del__(self) -> None:
        # The thread that waited ended (a worker's lane): its listening session ends with it.
        with contextlib.suppress(Exception):  # at interpreter exit, or a connection already gone
            self.drop()

    def drop(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None


def _soonest(alias: str, queues: set[str]) -> float | None:
    """Seconds until the first deferred task of ``queues`` in ``alias`` is due, by the database
    clock (None: none is deferred)."""
    left = ExpressionWrapper(F("run_after") - DbNow(), output_field=DurationField())
    found = (Task.objects.db_manager(alias).pending().queued(sorted(queues)).filter(run_after__gt=DbNow())
             .aggregate(soonest=Min(left))["soonest"])
    return None if found is None else found.total_seconds()
