"""The slots of a worker that runs several tasks at once (``work(..., concurrency=N)``).

A :class:`Pool` holds up to ``size`` claims in flight: sync tasks each on one of ``size``
threads (each with its own Django connections, closed when the thread ends), ``async def``
tasks on one event loop in one thread of its own, their ORM calls each on a database thread of
its own while it runs (:mod:`django_taskclaim.db_threads`, each thread its own connection). A
slot is free again only when its task's body has returned: a sync body past its timeout cannot
be stopped, and keeps its slot until it returns. The pool knows nothing of claims
beyond handing each to ``run`` or ``arun``; the worker (:mod:`django_taskclaim.worker`) claims,
starts and counts.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

from django.db import connections

from .db_threads import DbThreads

#: A thread's "no more work" in its queue.
_DONE: Any = object()


class Pool:
    """Up to ``size`` tasks in flight: ``run(item)`` on threads, ``arun(item)`` on one event loop
    (``is_async(item)`` says which), each one's ORM calls on a database thread of its own. The first
    error a task lets out stops the pool's intake and is raised by :meth:`close` (a shutdown inside
    a task, an unexpected error)."""

    def __init__(self, size: int, run: Callable[[Any], None], arun: Callable[[Any], Awaitable[None]],
                 is_async: Callable[[Any], bool]) -> None:
        self.size, self.run, self.arun, self.is_async = size, run, arun, is_async
        self.db = DbThreads()
        self.busy = 0
        self.changed = threading.Condition(threading.Lock())
        self.errors: list[BaseException] = []
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.idle_threads = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread: threading.Thread | None = None
        self.nudged = False

    def free(self) -> int:
        """Slots free now (none once a task let an error out)."""
        with self.changed:
            return 0 if self.errors else self.size - self.busy

    def wait(self, timeout: float | None) -> None:
        """Until a slot frees or :meth:`nudge` is called (or ``timeout`` seconds pass); at once if one
        is free or a nudge came since the last wait."""
        with self.changed:
            if self.busy >= self.size and not self.errors and not self.nudged:
                self.changed.wait(timeout)
            self.nudged = False

    def nudge(self) -> None:
        """Wake :meth:`wait` (or make its next call return at once): the caller has news for the
        thread that fills the slots."""
        with self.changed:
            self.nudged = True
            self.changed.notify_all()

    def wait_idle(self) -> None:
        """Until every task in flight has returned."""
        with self.changed:
            while self.busy:
                self.changed.wait()

    def submit(self, item: Any) -> None:
        """Run ``item`` in a free slot (the caller asked :meth:`free` first)."""
        with self.changed:
            self.busy += 1
        if self.is_async(item):
            asyncio.run_coroutine_threadsafe(self._arun(item), self._event_loop())
            return
        with self.changed:
            start = self.idle_threads == 0 and len(self.threads) < self.size
            self.idle_threads -= 0 if start else 1
        if start:
            thread = threading.Thread(target=self._thread, name=f"taskclaim-slot-{len(self.threads)}", daemon=True)
            self.threads.append(thread)
            thread.start()
        self.jobs.put(item)

    def close(self) -> None:
        """Wait for the tasks in flight, end the threads and the loop; raise a task's error."""
        self.wait_idle()
        for _ in self.threads:
            self.jobs.put(_DONE)
        for thread in self.threads:
            thread.join()
        self.db.close()  # the connections of the async tasks' ORM calls, each on its own thread
        if self.loop is not None and self.loop_thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.loop_thread.join()
            self.loop.close()
        if self.errors:
            raise self.errors[0]

    def _done(self, error: BaseException | None) -> None:
        with self.changed:
            self.busy -= 1
            if error is not None:
                self.errors.append(error)
            self.changed.notify_all()

    def _thread(self) -> None:
        try:
            while (item := self.jobs.get()) is not _DONE:
                error = None
                try:
                    self.run(item)
                except BaseException as exc:
                    error = exc
                with self.changed:
                    self.idle_threads += 1
                self._done(error)
        finally:
            connections.close_all()  # this thread's connections

    async def _arun(self, item: Any) -> None:
        error = None
        try:
            async with self.db.lane():
                await self.arun(item)
        except BaseException as exc:
            error = exc
        self._done(error)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            loop = asyncio.new_event_loop()
            started: Future[None] = Future()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set_result, None)
                loop.run_forever()

            self.loop_thread = threading.Thread(target=serve, name="taskclaim-async-slots", daemon=True)
            self.loop_thread.start()
            started.result()
            self.loop = loop
        return self.loop


class Spares:
    """Items held ready for a slot that is about to free: :meth:`take` hands one over without a
    round trip to the thread that fills the slots, which holds as many as the slots took in the
    last :attr:`WINDOW` seconds (``size`` at most; :meth:`wanted`) and is nudged when a take leaves
    half of those or fewer. A pool of long tasks, whose slots seldom free, holds one or none."""

    #: Seconds of demand held ready.
    WINDOW = 1.0

    def __init__(self, size: int, nudge: Callable[[], None]) -> None:
        self.size, self.nudge = size, nudge
        self.items: deque[Any] = deque()
        self.lock = threading.Lock()
        self.taken: deque[float] = deque(maxlen=size)  # when the last ``size`` takes came

    def take(self) -> Any:
        """The oldest item held ready (``None``: none)."""
        now = time.monotonic()
        with self.lock:
            item = self.items.popleft() if self.items else None
            self.taken.append(now)
            # None taken: the slot frees, which wakes the claimer anyway, with a slot to fill (a nudge
            # now would have it claim for spares alone while that slot is still busy).
            low = item is not None and len(self.items) <= self._target(now) // 2
        if low:
            self.nudge()
        return item

    def wanted(self) -> int:
        """How many more to hold now."""
        with self.lock:
            return max(0, self._target(time.monotonic()) - len(self.items))

    def _target(self, now: float) -> int:
        return sum(1 for at in self.taken if now - at < self.WINDOW)

    def soonest(self, left: Callable[[Any], float]) -> float | None:
        """The least ``left(item)`` of the items held (``None``: none held)."""
        with self.lock:
            return min(map(left, self.items), default=None)

    def put(self, items: list[Any]) -> None:
        with self.lock:
            self.items.extend(items)

    def give(self, count: int) -> list[Any]:
        """Up to ``count`` items, the oldest first (for the slots that are free now)."""
        with self.lock:
            return [self.items.popleft() for _ in range(min(count, len(self.items)))]

    def remove(self, keep: Callable[[Any], bool]) -> list[Any]:
        """Remove and return the items ``keep`` refuses (held too long; all, when stopping)."""
        with self.lock:
            kept: deque[Any] = deque()
            gone: list[Any] = []
            for item in self.items:
                (kept if keep(item) else gone).append(item)
            self.items = kept
            return gone
