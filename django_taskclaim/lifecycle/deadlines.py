"""Timeouts that fence: an attempt that runs past its timeout loses its claim at that moment.

``watch(claim, seconds, policy, cancel)`` around a body: when the body is still running
``seconds`` after the block began, the claim's failure is written with ``TimedOut`` (retried or
not by ``policy``), one statement guarded by the claim's token. The task then is no longer
RUNNING under that token, so nothing the body writes in ``fenced()`` afterwards commits, and no
ending of its own is accepted (``StaleClaim``); ``cancel()`` then stops what can be stopped (an
asyncio task). A sync body cannot be stopped: it runs on until it returns, harmlessly.

One watcher thread per process keeps the deadlines, soonest first; each one that passes is
written from a short thread of its own, since that write may wait for a row lock (a ``fenced()``
block of the body that holds it) and must not hold up the other deadlines.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import Error as DbError
from django.db import connections

from ..exceptions import StaleClaim, TimedOut
from .claim import Claim
from .execution import Policy

logger = logging.getLogger("django_taskclaim")


@contextmanager
def watch(claim: Claim, seconds: float | None, policy: Policy,
          cancel: Callable[[], object] | None = None) -> Iterator[None]:
    """Fence ``claim`` off if the block is still running after ``seconds`` (``None``: no timeout)."""
    if seconds is None:
        yield
        return
    entry = _Deadline(claim, seconds, policy, cancel)
    claim.timeout_at = entry.due
    _watcher().add(entry)
    try:
        yield
    finally:
        if entry.disarm():
            _watcher().dropped()
            if claim.overran():
                # The body returned late and the watcher has not got to it (this process was
                # paused or starved): the attempt timed out all the same, fenced off here (its
                # completion was refused by the same test of the same deadline). An event loop's
                # thread may not use the ORM: the write then goes to a thread of its own.
                if _in_event_loop():
                    entry.fire_now(late=True)
                else:
                    entry.fence(late=True, on_this_thread=True)


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def time_out(claim: Claim, seconds: float, policy: Policy) -> str | None:
    """Fence ``claim`` off now for running past ``seconds``: its failure written with ``TimedOut``
    (retried by ``policy`` while attempts remain). The new status, or ``None`` when the claim had
    ended meanwhile (completed in time, or taken over)."""
    error = TimedOut(f"the attempt ran past its timeout of {seconds:g} s: {claim.named()}")
    retry = policy.retries(error)
    # The next task of a one-at-a-time worker's batch must not start now: this worker is still
    # busy with the body that cannot be stopped. It stays reserved, started when its turn comes.
    claim.then_start(None)
    claim.lost_reason = error  # before the write: the body's ending, refused by it, is counted as this
    try:
        status = claim.fail(policy.recorded(error), retry=retry,
                            delay=policy.retry_delay(claim, error) if retry else None)
    except StaleClaim:
        claim.lost_reason = None
        return None
    logger.warning("task timed out after %g s, its claim fenced off: %s", seconds, claim.named(),
                   extra={**claim.log_extra(), "timeout": seconds})
    return status


class _Deadline:
    __slots__ = ("armed", "cancel", "claim", "due", "lock", "policy", "seconds")

    def __init__(self, claim: Claim, seconds: float, policy: Policy, cancel: Callable[[], object] | None) -> None:
        self.claim, self.seconds, self.policy, self.cancel = claim, seconds, policy, cancel
        self.due = time.monotonic() + seconds
        self.armed = True
        self.lock = threading.Lock()

    def disarm(self) -> bool:
        """No fencing from now on; whether it was still armed (its entry now waits for nothing)."""
        with self.lock:
            armed, self.armed = self.armed, False
            return armed

    def fire(self) -> None:
        """The deadline passed: fence the claim off (from a thread of its own), then cancel."""
        with self.lock:
            if not self.armed:
                return
            self.armed = False
        self.fire_now()

    def fire_now(self, late: bool = False) -> None:
        threading.Thread(target=self.fence, args=(late,), name=f"taskclaim-timeout-{self.claim.token}",
                         daemon=True).start()

    def fence(self, late: bool = False, on_this_thread: bool = False) -> None:
        """Write the claim's timeout (``time_out``), then cancel what can be cancelled; on a thread
        of its own, close its connections after (not those of the thread that ran the body).
        ``late``: the body has returned, and there is nothing to do if the claim ended itself (only
        then may its ending be asked for: a body still in a fenced() block holds it uncommitted)."""
        try:
            if late and self.claim.ended() is not None:
                return
            if time_out(self.claim, self.seconds, self.policy) is not None and self.cancel is not None:
                self.cancel()
        except DbError as exc:
            # The failure could not be written: the claim runs out with its lease, by the rules.
            logger.warning("a timed-out task could not be fenced off: %s: %s", self.claim.named(), exc,
                           extra=self.claim.log_extra())
        finally:
            if not on_this_thread:
                connections.close_all()


class _Watcher:
    """The process's deadlines, soonest first, and the one thread that waits for them."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.queue: list[tuple[float, int, _Deadline]] = []
        self.order = itertools.count()
        self.gone = 0  # entries disarmed before they were due
        self.thread = threading.Thread(target=self._run, daemon=True, name="taskclaim-deadlines")
        self.thread.start()

    def add(self, entry: _Deadline) -> None:
        with self.cond:
            heapq.heappush(self.queue, (entry.due, next(self.order), entry))
            if self.queue[0][2] is entry:
                self.cond.notify()

    def dropped(self) -> None:
        """An entry was disarmed before its time; drop such entries once they are most of the queue
        (a busy worker with long timeouts would otherwise keep one per task until it is due)."""
        with self.cond:
            self.gone += 1
            if self.gone > 1000 and 2 * self.gone > len(self.queue):
                self.queue = [item for item in self.queue if item[2].armed]
                heapq.heapify(self.queue)
                self.gone = 0

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.queue or self.queue[0][0] > time.monotonic():
                    self.cond.wait(self.queue[0][0] - time.monotonic() if self.queue else None)
                _, _, entry = heapq.heappop(self.queue)
            entry.fire()


_WATCHER: _Watcher | None = None
_WATCHER_LOCK = threading.Lock()


def _forget_watcher() -> None:
    global _WATCHER, _WATCHER_LOCK  # a forked child has no watcher thread: it makes its own
    _WATCHER, _WATCHER_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_watcher)


def _watcher() -> _Watcher:
    global _WATCHER
    with _WATCHER_LOCK:
        if _WATCHER is None:
            _WATCHER = _Watcher()
        return _WATCHER
