"""The awaitable methods of a claim (``acomplete``…, ``akeepalive``, ``afenced``).

Django's ORM and raw cursors are synchronous, so every awaitable here runs the *one* sync
implementation of its transition through asgiref's ``sync_to_async(thread_sensitive=True)``,
as Django's own ``a*`` queryset methods do. ``akeepalive`` schedules its heartbeats from an
asyncio task instead of a thread, so one event loop can hold many claims.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import Error as DbError  # DatabaseError, and InterfaceError of a closed connection
from django.db import connections

from ..exceptions import StaleClaim

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
