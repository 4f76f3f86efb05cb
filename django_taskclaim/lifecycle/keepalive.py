"""``Claim.keepalive()``: heartbeats from a background thread while the work runs."""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections

from .. import signals
from ..exceptions import StaleClaim
from ..store import get_store
from . import transitions

logger = logging.getLogger("django_taskclaim")


class KeepaliveMixin:
    """The keepalive of :class:`~django_taskclaim.lifecycle.handle.Claim`."""

    if TYPE_CHECKING:  # provided by Claim
        task_id: int
        key: str
        tenant: str
        token: int
        owner: str
        lease: float
        using: str
        lost: threading.Event
        lost_reason: BaseException | None
        _finishing: bool
        _row_held: bool

        def heartbeat(self, lease: float | timedelta | None = None) -> datetime | None: ...
        def _log_extra(self) -> dict[str, Any]: ...

    @contextmanager
    def keepalive(self, interval: float | None = None) -> Iterator[Any]:
        """Heartbeat from a background thread every ``lease / 3`` seconds while the block runs.

        If a heartbeat is refused (another worker took over), or the database cannot be reached
        until the lease would have run out by this worker's own clock, ``claim.lost`` is set and
        ``StaleClaim`` is raised when the block ends: the work must not be published. Completing
        (or failing, releasing) the claim inside the block ends the heartbeats, with no error.

        Inside a transaction (``atomic()``, ``ATOMIC_REQUESTS``, autocommit off) the thread's
        heartbeats commit on its own connection, which works for a claim committed before the
        transaction began. A claim made inside the still-open transaction is invisible to other
        connections; its row lock holds the task until commit, so the thread only watches.
        """
        every = self.lease / 3 if interval is None else interval
        if isinstance(every, bool) or not isinstance(every, int | float) or not 0 < every < float("inf"):
            raise ValueError(f"keepalive interval must be a positive number of seconds, not {every!r}")
        beats = _Beats(self, every, transitions.in_transaction(self.using))
        _starter().add(beats)
        try:
            yield self
        finally:
            beats.end()
        if self.lost.is_set() and not self._finishing:
            raise StaleClaim(self.key, self.tenant, self.token, "keepalive")

    def _beat(self, stop: threading.Event, every: float, outer: bool, started: float) -> None:
        # The local deadline may only make us give up early; the database decides expiry.
        deadline = started + self.lease
        limited = not outer
        wait = max(0.0, started + every - time.monotonic())  # the first beat: `every` after the start
        try:
            while not stop.wait(wait):
                wait = every
                if self._finishing:
                    return
                try:
                    if not limited:  # on first use: a short block never opens this connection
                        self._limit_lock_waits(min(every, 1.0))
                        limited = True
                    if outer and not self._free_to_beat():
                        # Held by the caller's open transaction: nobody can take over before it ends.
                        deadline = time.monotonic() + self.lease
                        continue
                    self.heartbeat()
                    deadline = time.monotonic() + self.lease
                except StaleClaim as exc:
                    if not self._finishing:
                        self._lose(exc)
                    return
                except DatabaseError as exc:
                    logger.warning("heartbeat failed: %s", exc, extra=self._log_extra())
                    if time.monotonic() >= deadline:
                        self._lose(exc)
                        return
                    # A session the server dropped never works again: close it so the next
                    # heartbeat opens a new one (whose lock-wait limit must be set again).
                    conn = connections[self.using]
                    conn.close_if_unusable_or_obsolete()
                    if conn.connection is None:
                        limited = not outer
        finally:
            if outer and limited:
                self._limit_lock_waits(None)
            connections[self.using].close()

    def _limit_lock_waits(self, seconds: float | None) -> None:
        """On this thread's connection: wait at most ``seconds`` for a lock (the caller's
        transaction may hold the task row, and waits for this thread at the end of the block).

        ``None`` restores the default before the connection goes back (to a pool, perhaps).
        """
        conn = connections[self.using]
        if seconds is None and conn.connection is None:
            return  # never opened, or gone: nothing to restore
        try:
            with conn.cursor() as cursor:
                get_store(self.using).limit_lock_waits(cursor, seconds)
        except DatabaseError:
            if seconds is not None:
                raise
            # The connection is gone: nothing to restore.

    def _free_to_beat(self) -> bool:
        """From this thread's own connection: whether a heartbeat can and should be sent now.

        Not when the claim is not committed yet (made inside the caller's open transaction: the
        row shows no token or the previous one), nor while a transaction holds the row (the
        caller's ``fenced()`` or heartbeat: no one can take over meanwhile, and the heartbeat
        would wait for it). Databases with row locks answer both with ``SKIP LOCKED``, whoever
        holds the lock; SQLite has none, so this claim's own record of holding the row is used.
        A larger token is a takeover: the heartbeat that follows reports it.
        """
        store = get_store(self.using)
        if self._row_held and not store.row_locks:
            return False
        with connections[self.using].cursor() as cursor:
            token = store.row_free(cursor, self.task_id)
        return token is not None and token >= self.token

    def _lose(self, exc: BaseException) -> None:
        self.lost_reason = exc
        self.lost.set()
        logger.warning("heartbeat lost: %s", exc, extra=self._log_extra())
        transitions.send(self.using, signals.heartbeat_lost, claim=self, error=exc)


# -- deferred heartbeat threads ----------------------------------------------------------------
# A block's heartbeat thread starts only once the block has run for one interval: most blocks
# of a busy queue end long before (a 30 s lease beats every 10 s), and starting and joining a
# thread for each of them cost more client CPU than the task's own claim and completion. One
# starter thread per process holds the blocks that may still need one, soonest first.

_WAITING, _STARTED, _ENDED = range(3)


class _Beats:
    """The heartbeats of one ``keepalive()`` block: not started, started (a thread), or ended."""

    def __init__(self, claim: KeepaliveMixin, every: float, outer: bool) -> None:
        self.claim, self.every, self.outer = claim, every, outer
        self.started = time.monotonic()
        self.due = self.started + every
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.state = _WAITING
        self.thread: threading.Thread | None = None

    def begin(self) -> None:
        """Start the heartbeat thread, unless the block has ended meanwhile."""
        with self.lock:
            if self.state != _WAITING:
                return
            self.thread = threading.Thread(
                target=self.claim._beat, args=(self.stop, self.every, self.outer, self.started),
                daemon=True, name=f"taskclaim-keepalive-{self.claim.token}")
            self.thread.start()
            self.state = _STARTED

    def end(self) -> None:
        """The block is over: no thread will start; one that did is stopped and joined."""
        with self.lock:
            thread, self.state = self.thread, _ENDED
        self.stop.set()
        if thread is not None:
            thread.join()
        else:
            _starter().ended()


class _Starter:
    """One daemon thread per process that starts each block's heartbeat thread when it is due."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.queue: list[tuple[float, int, _Beats]] = []
        self.order = itertools.count()
        self.gone = 0  # queued blocks that ended before their due time
        self.thread: threading.Thread | None = None

    def add(self, beats: _Beats) -> None:
        with self.cond:
            heapq.heappush(self.queue, (beats.due, next(self.order), beats))
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, daemon=True, name="taskclaim-keepalive-starter")
                self.thread.start()
            if self.queue[0][2] is beats:  # sooner than what the thread waits for
                self.cond.notify()

    def ended(self) -> None:
        """A queued block ended unstarted; drop such blocks once they are most of the queue."""
        with self.cond:
            self.gone += 1
            if self.gone > 1000 and 2 * self.gone > len(self.queue):
                self.queue = [entry for entry in self.queue if entry[2].state == _WAITING]
                heapq.heapify(self.queue)
                self.gone = 0

    def _run(self) -> None:
        while True:
            with self.cond:
                while True:
                    while self.queue and self.queue[0][2].state != _WAITING:
                        heapq.heappop(self.queue)
                        self.gone = max(0, self.gone - 1)
                    if not self.queue:
                        self.cond.wait()
                        continue
                    delay = self.queue[0][0] - time.monotonic()
                    if delay <= 0:
                        break
                    self.cond.wait(delay)
                beats = heapq.heappop(self.queue)[2]
            beats.begin()


_STARTER: _Starter | None = None
_STARTER_LOCK = threading.Lock()


def _forget_starter() -> None:
    # In a forked child: the parent's starter thread is not there, and the lock may have been
    # held by one of its threads at the fork.
    global _STARTER, _STARTER_LOCK
    _STARTER, _STARTER_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_starter)


def _starter() -> _Starter:
    """This process's starter (a forked child makes its own: see ``_forget_starter``)."""
    global _STARTER
    starter = _STARTER
    if starter is None:
        with _STARTER_LOCK:
            if _STARTER is None:
                _STARTER = _Starter()
            starter = _STARTER
    return starter
