"""``Claim.keepalive()`` and ``Claim.akeepalive()``: heartbeats from a background thread while
the work runs, one rule for both.

The sync block and the async block differ only in how they are entered and left; the
heartbeats, and the three rules that decide what a block's end means, are written once here:

- **Inside a transaction** (``atomic()``, ``ATOMIC_REQUESTS``, autocommit off, or an async
  block whose ORM thread is inside one), the heartbeats commit on the thread's own connection,
  which keeps a claim committed before the transaction alive. While a transaction holds the
  task's row (the caller's ``fenced()``, a claim made inside the still-open transaction), no one
  can take over, and the thread only watches.
- **Ended by itself**: a claim completed, failed or released inside the block ends the
  heartbeats; a heartbeat refused because of that ending is no loss.
- **Lost**: a heartbeat refused because another worker took over, or a database out of reach
  until the lease has surely run out by this worker's clock, sets ``claim.lost`` and makes the
  block end in ``StaleClaim``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import Error as DbError  # DatabaseError, and InterfaceError of a closed connection
from django.db import connections, transaction

from .. import signals
from ..exceptions import StaleClaim
from ..store import get_store
from . import renewal, transitions

logger = logging.getLogger("django_taskclaim")

#: A heartbeat from inside a caller's transaction waits at most this long for the task's row
#: (the caller's transaction may take it, and waits for this thread at the end of the block).
HELD_ROW_WAIT = 1.0


class KeepaliveMixin:
    """The keepalive of :class:`~django_taskclaim.lifecycle.claim.Claim`, sync and async."""

    if TYPE_CHECKING:  # provided by Claim
        task_id: int
        key: str
        tenant: str
        token: int
        owner: str
        lease: float
        using: str
        _lost: threading.Event | None
        lost_reason: BaseException | None
        _finishing: bool
        _row_held: bool
        _deadline: float
        _beating: threading.Thread | None
        renew_together: bool
        lease_expires_at: datetime | None

        @property
        def lost(self) -> threading.Event: ...
        def heartbeat(self, lease: float | timedelta | None = None) -> datetime | None: ...
        def log_extra(self) -> dict[str, Any]: ...
        def named(self) -> Any: ...

    def keepalive(self, interval: float | None = None) -> AbstractContextManager[Any]:
        """Heartbeat from a background thread every ``lease / 3`` seconds while the block runs.

        If a heartbeat is refused (another worker took over), or the database cannot be reached
        until the lease would have run out by this worker's own clock, ``claim.lost`` is set and
        ``StaleClaim`` is raised when the block ends: the work must not be published. Completing
        (or failing, releasing) the claim inside the block ends the heartbeats, with no error.
        Inside a transaction see the module's rules.
        """
        return _Block(self, interval, None)

    def _keepalive(self, outer: bool) -> AbstractContextManager[Any]:
        """:meth:`keepalive` for a caller that has just asked whether a transaction is open."""
        return _Block(self, None, outer)

    def akeepalive(self, interval: float | None = None) -> AbstractAsyncContextManager[Any]:
        """:meth:`keepalive` for async code: the same heartbeat thread and the same rules.

        The transaction it looks at is the one of the thread Django runs this context's ORM
        calls on (``sync_to_async``), which is the caller's ``atomic()`` when a sync view runs
        async work through ``async_to_sync``.
        """
        return self._akeepalive(interval, None)

    @asynccontextmanager
    async def _akeepalive(self, interval: float | None, outer: bool | None) -> AsyncIterator[Any]:
        """:meth:`akeepalive`; ``outer``: whether the ORM thread is in a transaction, when the caller
        has just asked it there (``None``: ask, one call on that thread)."""
        if outer is None:
            outer = await sync_to_async(transitions.in_transaction)(self.using)
        beats = self._begin(interval, outer)
        try:
            yield self
        finally:
            thread = beats.end(join=False)
            if thread is not None:  # a heartbeat may be in flight: wait for it off the event loop
                await asyncio.to_thread(thread.join)
        self._raise_if_lost()

    def _begin(self, interval: float | None, outer: bool) -> _Beats | renewal.Member:
        every = self.lease / 3 if interval is None else interval
        if isinstance(every, bool) or not isinstance(every, int | float) or not 0 < every < float("inf"):
            raise ValueError(f"keepalive interval must be a positive number of seconds, not {every!r}")
        if self.renew_together and not outer:
            return renewal.join(self, every)  # one statement a round with the process's other claims
        beats = _Beats(self, every, outer)
        _starter().add(beats)
        return beats

    def _raise_if_lost(self) -> None:
        # A claim that ended itself lost nothing, whatever its heartbeats met afterwards.
        lost = self._lost  # None: never made, so never set
        if lost is not None and lost.is_set() and not self._finishing:
            raise StaleClaim(self.key, self.tenant, self.token, "keepalive")

    def _beat(self, beats: _Beats) -> None:
        """The heartbeat thread's loop (its own database connection, closed at the end)."""
        # The local deadline may only make us give up early; the database decides expiry.
        give_up_at = self._deadline
        wait = max(0.0, beats.due - time.monotonic())
        self._beating = threading.current_thread()
        try:
            while not beats.stop.wait(wait):
                wait = beats.every
                if self._finishing:
                    return
                try:
                    if beats.outer:
                        if not self._free_to_beat():
                            # Held by a transaction: nobody can take over before it ends.
                            give_up_at = time.monotonic() + self.lease
                            continue
                        self._heartbeat_beside_a_transaction()
                    else:
                        self.heartbeat()
                    give_up_at = self._deadline
                except StaleClaim as exc:
                    if not self._finishing:
                        self._lose(exc)
                    return
                except DbError as exc:
                    logger.warning("heartbeat failed: %s: %s", self.named(), exc, extra=self.log_extra())
                    if time.monotonic() >= give_up_at:
                        self._lose(exc)
                        return
                    # A session the server dropped never works again: close it, the next
                    # heartbeat opens a new one.
                    connections[self.using].close_if_unusable_or_obsolete()
        finally:
            connections[self.using].close()

    def _heartbeat_beside_a_transaction(self) -> None:
        """A heartbeat that waits at most ``HELD_ROW_WAIT`` for the row, in a transaction of its
        own so that the limit is transaction-local (nothing leaks to a pooled session)."""
        with transaction.atomic(using=self.using):
            with connections[self.using].cursor() as cursor:
                get_store(self.using).limit_lock_waits(cursor, HELD_ROW_WAIT)
            self.heartbeat()

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
        logger.warning("heartbeat lost: %s: %s", self.named(), exc, extra=self.log_extra())
        transitions.send(self.using, signals.heartbeat_lost, claim=self, error=exc)


class _Block:
    """A ``keepalive()`` block: its heartbeats are queued when it is entered and end with it.

    A class rather than a generator: a queue worker enters one for every task."""

    __slots__ = ("beats", "claim", "interval", "outer")

    def __init__(self, claim: KeepaliveMixin, interval: float | None, outer: bool | None) -> None:
        self.claim, self.interval, self.outer = claim, interval, outer

    def __enter__(self) -> Any:
        outer = transitions.in_transaction(self.claim.using) if self.outer is None else self.outer
        self.beats = self.claim._begin(self.interval, outer)
        return self.claim

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self.beats.end()
        if kind is None:  # the block's own error, if any, is the news
            self.claim._raise_if_lost()


# -- deferred heartbeat threads ----------------------------------------------------------------
# A block's heartbeat thread starts only once its first heartbeat is due: most blocks of a busy
# queue end long before (a 30 s lease beats every 10 s), and a thread started and joined for
# each of them would cost more than the task's own claim and completion. One starter thread per
# process holds the blocks that may still need one, soonest first.

_WAITING, _STARTED, _ENDED = range(3)


class _Beats:
    """The heartbeats of one keepalive block: not started, started (a thread), or ended.

    The first heartbeat is due one interval after the claim was made (not after the block
    began): a claim that waited its turn has that much less of its lease left.
    """

    #: Set when the block ends: the heartbeat thread's wait. Made with the thread (most blocks
    #: never start one).
    stop: threading.Event

    def __init__(self, claim: KeepaliveMixin, every: float, outer: bool) -> None:
        # Dropped when the block ends unstarted: the starter's queue keeps such blocks until
        # they are due, and the claim (its row, its payload) need not live that long.
        self.claim: KeepaliveMixin | None = claim
        self.every, self.outer = every, outer
        self.due = claim._deadline - claim.lease + every
        self.lock = threading.Lock()
        self.state = _WAITING
        self.thread: threading.Thread | None = None

    def begin(self) -> None:
        """Start the heartbeat thread, unless the block has ended meanwhile."""
        with self.lock:
            claim = self.claim
            if self.state != _WAITING or claim is None:
                return
            self.stop = threading.Event()
            self.thread = threading.Thread(target=claim._beat, args=(self,), daemon=True,
                                           name=f"taskclaim-keepalive-{claim.token}")
            self.thread.start()
            self.state = _STARTED

    def end(self, join: bool = True) -> threading.Thread | None:
        """The block is over: no thread will start; one that did is stopped (and joined, or
        returned for the caller to join)."""
        with self.lock:
            thread, self.state = self.thread, _ENDED
            if thread is None:
                self.claim = None
        if thread is None:
            _starter().ended()
            return None
        self.stop.set()
        if join:
            thread.join()
            return None
        return thread


class _Starter:
    """One daemon thread per process that starts each block's heartbeat thread when it is due."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.queue: list[tuple[float, int, _Beats]] = []
        self.order = itertools.count()
        self.gone = 0  # queued blocks that ended before their due time
        self.thread: threading.Thread | None = None
        # When the thread looks at the queue next: the end of its wait (inf: until notified),
        # -inf while it is not waiting. A block due later needs no wake-up.
        self.wakes_at = -math.inf

    def add(self, beats: _Beats) -> None:
        with self.cond:
            heapq.heappush(self.queue, (beats.due, next(self.order), beats))
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, daemon=True, name="taskclaim-keepalive-starter")
                self.thread.start()
            if beats.due < self.wakes_at:  # sooner than the thread would look
                self.wakes_at = beats.due
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
                    if not self.queue:
                        self.wakes_at = math.inf
                        self.cond.wait()
                        continue
                    due, _, beats = self.queue[0]
                    delay = due - time.monotonic()
                    if delay > 0:
                        # Ended blocks stay queued until they are due (or ended() drops them):
                        # popped at once, they would leave the thread waiting for a notify, and
                        # each new block of a busy worker would wake it.
                        self.wakes_at = due
                        self.cond.wait(delay)
                        continue
                    heapq.heappop(self.queue)
                    if beats.state == _WAITING:
                        break
                    self.gone = max(0, self.gone - 1)
                self.wakes_at = -math.inf
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
