"""``Claim.keepalive()``: heartbeats from a background thread while the work runs."""

from __future__ import annotations

import logging
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
        outer = transitions.in_transaction(self.using)
        stop = threading.Event()
        thread = threading.Thread(target=self._beat, args=(stop, every, outer), daemon=True,
                                  name=f"taskclaim-keepalive-{self.token}")
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
        if self.lost.is_set() and not self._finishing:
            raise StaleClaim(self.key, self.tenant, self.token, "keepalive")

    def _beat(self, stop: threading.Event, every: float, outer: bool) -> None:
        # The local deadline may only make us give up early; the database decides expiry.
        deadline = time.monotonic() + self.lease
        limited = not outer
        try:
            while not stop.wait(every):
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
