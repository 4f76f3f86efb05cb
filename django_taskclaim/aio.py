"""The async API: awaitable twins of the claim calls, ``akeepalive`` and ``arun_once``.

Django's ORM and raw cursors are synchronous, so every awaitable here runs the *one* sync
implementation of its transition through asgiref's ``sync_to_async(thread_sensitive=True)``,
as Django's own ``a*`` queryset methods do: the guarantees (one guarded statement per
transition, fencing, the database clock) are the sync API's, not a copy of them.
``akeepalive`` schedules its heartbeats from an asyncio task instead of a thread, and
``arun_once``'s waiters poll with ``asyncio.sleep``, so one event loop can hold many callers.

Thread-sensitive calls share one thread per request (or per event loop outside a request):
a long blocking call made with ``sync_to_async`` in the same context delays the heartbeats
queued behind it. Give such work ``thread_sensitive=False``, or keep it under ``keepalive()``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import Error as DbError  # DatabaseError, and InterfaceError of a closed connection
from django.db import connections

from .exceptions import StaleClaim

if TYPE_CHECKING:
    from .claims import Claim
    from .keys import TaskKey

logger = logging.getLogger("django_taskclaim")

T = TypeVar("T")


class AsyncClaimMixin:
    """The awaitable methods of :class:`~django_taskclaim.claims.Claim`, each wrapping its sync twin."""

    if TYPE_CHECKING:  # provided by Claim
        key: str
        tenant: str
        token: int
        lease: float
        using: str
        lost: Any

        def heartbeat(self, lease: float | timedelta | None = None) -> datetime | None: ...
        def complete(self, result: Any = None, result_ref: str = "") -> None: ...
        def fail(self, error: BaseException | str, retry: bool = False) -> str: ...
        def release(self) -> None: ...
        def check(self) -> None: ...
        def fenced(self) -> Any: ...
        def _lose(self, exc: BaseException) -> None: ...
        def _log_extra(self) -> dict[str, Any]: ...

    async def aheartbeat(self, lease: float | timedelta | None = None) -> datetime | None:
        """:meth:`heartbeat`, awaitable."""
        return await sync_to_async(self.heartbeat)(lease)

    async def acomplete(self, result: Any = None, result_ref: str = "") -> None:
        """:meth:`complete`, awaitable."""
        await sync_to_async(self.complete)(result, result_ref)

    async def afail(self, error: BaseException | str, retry: bool = False) -> str:
        """:meth:`fail`, awaitable; returns the new status."""
        return await sync_to_async(self.fail)(error, retry)

    async def arelease(self) -> None:
        """:meth:`release`, awaitable."""
        await sync_to_async(self.release)()

    async def acheck(self) -> None:
        """:meth:`check`, awaitable: ``StaleClaim`` unless this claim still owns the task."""
        await sync_to_async(self.check)()

    async def afenced(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run the sync ``func(*args, **kwargs)`` inside :meth:`fenced` on the ORM's thread.

        Django has no async transactions, so the fenced block cannot span ``await``\\ s: put
        the effect's ORM writes (and ``claim.complete(...)``, to commit them together) in one
        sync function. Its writes commit only if this claim still owns the task; otherwise
        ``StaleClaim`` is raised and nothing is written. Returns what ``func`` returns.
        """

        def run() -> T:
            with self.fenced():
                return func(*args, **kwargs)

        return await sync_to_async(run)()

    @asynccontextmanager
    async def akeepalive(self, interval: float | None = None) -> AsyncIterator[Any]:
        """Heartbeat from an asyncio task every ``lease / 3`` seconds while the block runs.

        The twin of :meth:`keepalive`: if a heartbeat is refused (another worker took over), or
        the database cannot be reached until the lease would have run out by this worker's own
        clock, ``claim.lost`` is set and ``StaleClaim`` is raised when the block ends.
        """
        if await sync_to_async(_in_atomic_block)(self.using):
            # The claim's row stays locked until that transaction commits: nothing to renew.
            yield self
            return
        every = interval if interval is not None else self.lease / 3
        stop = asyncio.Event()
        beater = asyncio.create_task(self._abeat(stop, every), name=f"taskclaim-akeepalive-{self.token}")
        try:
            yield self
        finally:
            stop.set()
            # Waits for a heartbeat in flight, so its outcome is known before the block ends.
            await beater
        if self.lost.is_set():
            raise StaleClaim(self.key, self.tenant, self.token, "keepalive")

    async def _abeat(self, stop: asyncio.Event, every: float) -> None:
        # The local deadline may only make us give up early; the database decides expiry.
        deadline = time.monotonic() + self.lease
        while True:
            try:
                await asyncio.wait_for(stop.wait(), every)
                return
            except TimeoutError:
                pass
            try:
                await self.aheartbeat()
                deadline = time.monotonic() + self.lease
            except StaleClaim as exc:
                await sync_to_async(self._lose)(exc)
                return
            except DbError as exc:
                logger.warning("heartbeat failed: %s", exc, extra=self._log_extra())
                # A dropped connection stays broken until closed: close it, the next one reconnects.
                await sync_to_async(_close_if_broken)(self.using)
                if time.monotonic() >= deadline:
                    await sync_to_async(self._lose)(exc)
                    return


def _in_atomic_block(using: str) -> bool:
    return connections[using].in_atomic_block


def _close_if_broken(using: str) -> None:
    connection = connections[using]
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()


async def arun_claimed(claim_: Claim, afunc: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
    """Await ``afunc`` under ``claim_`` with ``akeepalive`` and store its result.

    The twin of :func:`~django_taskclaim.runner.run_claimed`: a failure is recorded with
    ``retry=True`` and re-raised; a claim fenced off meanwhile stores nothing and raises
    ``StaleClaim``; a result that cannot be stored ends the task FAILED (``InvalidResult``).
    """
    try:
        async with claim_.akeepalive():
            result = await afunc(*args, **kwargs)
    except StaleClaim:
        raise
    except Exception as exc:
        try:
            await claim_.afail(exc, retry=True)
        except StaleClaim:
            logger.warning("failure of a fenced-off claim not recorded",
                           extra={"key": claim_.key, "tenant": claim_.tenant, "token": claim_.token})
        raise
    from .claims import complete_or_fail

    # The work ran (its effects may have landed): a result that cannot be stored ends it FAILED.
    await sync_to_async(complete_or_fail)(claim_, result)
    return result


async def arun_once(
    key: str | TaskKey, afunc: Callable[..., Awaitable[T]], /, *args: Any, tenant: str = "", payload: Any = None,
    lease: float | timedelta | None = None, on_busy: str = "raise", **kwargs: Any,
) -> Any:
    """Await ``afunc(*args, **kwargs)`` at most once for ``(tenant, key)`` and return its result.

    The twin of :func:`~django_taskclaim.run_once` for coroutine functions. Any number of
    callers, in one event loop (``asyncio.gather``) or across processes, race through the
    database claim: one runs ``afunc``; the others get ``TaskBusy`` (``on_busy="raise"``) or
    poll with ``asyncio.sleep`` until it ends and return its stored result (``"wait"``).
    """
    from .claims import claim
    from .runner import ON_BUSY, WAIT, stored_answer

    if on_busy not in ON_BUSY:
        raise ValueError(f"on_busy must be one of {ON_BUSY}, not {on_busy!r}")
    if not callable(afunc):
        raise TypeError(f"arun_once needs a coroutine function, not {afunc!r}")
    aclaim = sync_to_async(claim)
    task = None
    while True:
        if task is None or not task.is_terminal:
            outcome = await aclaim(key, tenant=tenant, lease=lease, payload=payload)
            if outcome.claim is not None:
                return await arun_claimed(outcome.claim, afunc, *args, **kwargs)
            task = outcome.task
        answer = stored_answer(task, on_busy)
        if answer is not WAIT:
            return answer
        # A finished task is answered without another claim: one ``duplicate`` row per waiter.
        task = await _await_while_busy(task)


async def _await_while_busy(task: Any) -> Any:
    """Poll (``asyncio.sleep``, never a blocking sleep) until no live lease holds the task;
    its state then (``None`` if purged)."""
    from .backends import DbNow
    from .conf import settings
    from .models import Task

    interval = settings.POLL_INTERVAL
    live = Task.objects.using(task._state.db).filter(
        pk=task.pk, status=Task.Status.RUNNING, lease_expires_at__gte=DbNow())
    while True:
        await asyncio.sleep(interval)
        if not await live.aexists():
            return await Task.objects.using(task._state.db).filter(pk=task.pk).afirst()
