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
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async

from .conf import settings
from .exceptions import StaleClaim
from .lifecycle import Claim, claim, complete_or_fail
from .models import Task
from .runner import ON_BUSY, WAIT, stored_answer

if TYPE_CHECKING:
    from .keys import TaskKey

logger = logging.getLogger("django_taskclaim")

T = TypeVar("T")


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
    interval = settings.POLL_INTERVAL
    live = Task.objects.using(task._state.db).filter(pk=task.pk).live()
    while True:
        await asyncio.sleep(interval)
        if not await live.aexists():
            return await Task.objects.using(task._state.db).filter(pk=task.pk).afirst()
