"""``run_once`` and ``arun_once``: claim, keep alive, run, store the result — or return the stored one.

Both are the execution protocol (:mod:`django_taskclaim.lifecycle.execution`) with its
defaults: a failure is recorded with ``retry=True`` (PENDING while attempts remain) and
raised; a result that cannot be stored ends the task FAILED and raises ``InvalidResult``, so
the work never runs again. A claim fenced off meanwhile (another worker took the task over,
an operator released or cancelled it) stores nothing, and from then on the call is a
duplicate: the new owner's stored result, ``TaskFailed``, or ``on_busy`` while it runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async

from .lifecycle.api import claim
from .lifecycle.claim import Claim
from .lifecycle.execution import aanswered, aexecute, answered, arun_by_key, check_on_busy, execute, run_by_key

if TYPE_CHECKING:
    from .identity import TaskKey

T = TypeVar("T")


def run_once(
    key: str | TaskKey, func: Callable[..., Any], /, *args: Any, tenant: str = "", payload: Any = None,
    lease: float | timedelta | None = None, on_busy: str = "raise", **kwargs: Any,
) -> Any:
    """Run ``func(*args, **kwargs)`` at most once for ``(tenant, key)`` and return its result.

    A duplicate call after success returns the stored result without running ``func``. While
    another worker runs it, ``on_busy="raise"`` raises ``TaskBusy`` and ``on_busy="wait"``
    polls until it ends (taking it over if its owner's lease expires). A task that ended
    FAILED or CANCELLED raises ``TaskFailed``.

    ``key`` and ``func`` are positional-only, so ``func`` may take keywords named ``key`` or
    ``func``; ``tenant``, ``payload``, ``lease`` and ``on_busy`` belong to ``run_once``. To
    pass keywords of those names to ``func``, use :func:`run_once_with`.
    """
    return run_once_with(key, tenant=tenant, payload=payload, lease=lease, on_busy=on_busy)(func, *args, **kwargs)


def run_once_with(
    key: str | TaskKey, *, tenant: str = "", payload: Any = None, lease: float | timedelta | None = None,
    on_busy: str = "raise",
) -> Callable[..., Any]:
    """:func:`run_once` with its options given first: every argument of the returned call goes to ``func``.

    ``run_once_with(key, tenant="acme")(func, *args, **kwargs)``: no keyword of ``func``
    (``tenant``, ``payload``, ``lease``, ``on_busy``, ``key``) can collide with an option.
    """
    check_on_busy(on_busy)

    def call(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return run_by_key(lambda: claim(key, tenant=tenant, lease=lease, payload=payload),
                          lambda held: execute(held, func, args, kwargs).outcome(), on_busy)

    return call


def run_claimed(claim_: Claim, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run ``func`` under a claim you hold, with keepalive, and store its result (as ``run_once`` does).

    Fenced off meanwhile, it answers as a duplicate with ``on_busy="raise"`` would; when nobody
    holds the task then (an operator released it), ``StaleClaim``: claim it again to run it.
    """
    return answered(execute(claim_, func, args, kwargs).outcome())


async def arun_claimed(claim_: Claim, afunc: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
    """Await ``afunc`` under a claim you hold, with ``akeepalive``, and store its result (as :func:`run_claimed`)."""
    return await aanswered((await aexecute(claim_, afunc, args, kwargs)).outcome())


async def arun_once(
    key: str | TaskKey, afunc: Callable[..., Awaitable[T]], /, *args: Any, tenant: str = "", payload: Any = None,
    lease: float | timedelta | None = None, on_busy: str = "raise", **kwargs: Any,
) -> Any:
    """Await ``afunc(*args, **kwargs)`` at most once for ``(tenant, key)`` and return its result.

    The twin of :func:`run_once` for coroutine functions. Any number of callers, in one event
    loop (``asyncio.gather``) or across processes, race through the database claim: one runs
    ``afunc``; the others get ``TaskBusy`` (``on_busy="raise"``) or poll with ``asyncio.sleep``
    until it ends and return its stored result (``"wait"``).
    """
    check_on_busy(on_busy)
    if not callable(afunc):
        raise TypeError(f"arun_once needs a coroutine function, not {afunc!r}")
    aclaim = sync_to_async(claim)
    async def run(held: Claim) -> Any:
        return (await aexecute(held, afunc, args, kwargs)).outcome()

    return await arun_by_key(lambda: aclaim(key, tenant=tenant, lease=lease, payload=payload), run, on_busy)
