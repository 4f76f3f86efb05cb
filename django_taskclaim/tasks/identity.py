"""What a Django task declares about its claims: its identity (``keyed``) and its lease,
attempts and backoff (``claim_options``). Both set an attribute on the function and return
it unchanged, under ``@task()``: the framework keeps seeing the module-level (or coroutine)
function it checks, calls and compares."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from ..exceptions import InvalidArgument
from ..identity import TaskKey
from ..retries import Backoff
from ..values import canonical_json, concurrency_of, lease_seconds, positive_int, timeout_seconds
from .compat import normalize_json

F = TypeVar("F", bound=Callable[..., Any])

#: A later enqueue of an identity whose task FAILED or was CANCELLED gets that result: the
#: failure stands until an operator resets the task (Temporal's "reject duplicate").
REUSE = "reuse"
#: A later enqueue of an identity whose task FAILED or was CANCELLED runs it again, under the
#: same id, with its attempts counted afresh (Temporal's "allow duplicate failed only").
RUN_AGAIN = "run_again"
AFTER_FAILURE = (REUSE, RUN_AGAIN)

#: Seconds after its enqueue (or its ``run_after``) during which a task that a worker cannot import
#: is released uncharged rather than failed: ``OPTIONS["IMPORT_GRACE"]``'s default. A rolling
#: deploy's workers of the previous release meet the new release's tasks for about that long.
IMPORT_GRACE = 600.0


def import_grace(value: object) -> float:
    """``OPTIONS["IMPORT_GRACE"]`` as seconds (``None``: :data:`IMPORT_GRACE`); ``InvalidArgument`` for
    anything but a number from 0 to 30 days."""
    if value is None:
        return IMPORT_GRACE
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 30 * 86400:
        raise InvalidArgument(f"OPTIONS['IMPORT_GRACE'] must be a number of seconds from 0 to 2592000, not {value!r}")
    return float(value)


_IDENTITY = "__taskclaim_identity__"
_OPTIONS = "__taskclaim_options__"
#: Where ``coalescing.coalesced`` keeps a task's coalescing (here, so that ``keyed`` can refuse it).
COALESCED = "__taskclaim_coalesced__"


@dataclass(frozen=True)
class Identity:
    """A task's declared identity: ``of(*args, **kwargs)`` gives its key, and what a second
    enqueue gets after a failure."""

    of: Callable[..., str | TaskKey]
    after_failure: str = REUSE


@dataclass(frozen=True)
class ClaimOptions:
    """Per-task claim settings; ``None`` takes the backend's ``OPTIONS``, then the settings."""

    lease: float | None = None
    max_attempts: int | None = None
    backoff: Backoff | None = None
    #: Seconds an attempt may run before its claim is fenced off (``TimedOut``).
    timeout: float | None = None
    #: The concurrency key (a string, or a callable of the task's arguments returning one) and the
    #: most tasks of one key RUNNING at once; ``None``: no limit.
    concurrency_key: str | Callable[..., str] | None = None
    concurrency_limit: int | None = None

    def concurrency(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[str, int] | None:
        """The ``(concurrency key, limit)`` of a call with these arguments, or ``None``."""
        if self.concurrency_key is None or self.concurrency_limit is None:
            return None
        key = self.concurrency_key(*args, **kwargs) if callable(self.concurrency_key) else self.concurrency_key
        if not isinstance(key, str) or not key:
            raise InvalidArgument(f"claim_options(concurrency_key=...) must give a non-empty string, not {key!r}")
        return key, self.concurrency_limit


def keyed(identity: Callable[..., str | TaskKey], *, after_failure: str = REUSE) -> Callable[[F], F]:
    """Declare what work a task is: ``identity`` gets the task's arguments and returns the
    ``TaskKey`` (or key string) that names it.

    A keyed task is enqueued once per identity: a second ``enqueue`` with the same identity gets
    the first one's result (and the same id), with different arguments ``PayloadMismatch``. The
    arguments are compared as bound to the function's signature, defaults counted
    (:func:`bound_call`): ``charge(7, 10)`` and ``charge(order_id=7, amount=10)`` are one call.
    ``identity`` gets them as ``enqueue`` got them: give it the task's parameters.
    Never derive an identity from the arguments alone when two calls with the same arguments
    can be different work (two charges of the same amount): name the work (an order id, a
    run). ``after_failure`` (``REUSE`` or ``RUN_AGAIN``) says what a later enqueue gets once the
    task FAILED or was CANCELLED. A task without ``keyed`` is new work on every ``enqueue``.

        @task()
        @keyed(lambda order_id: TaskKey("charge", run=f"order-{order_id}", tenant="acme"))
        def charge(order_id): ...
    """
    if not callable(identity):
        raise TypeError(f"keyed() needs a callable that returns a TaskKey, not {identity!r}")
    if after_failure not in AFTER_FAILURE:
        raise ValueError(f"after_failure must be one of {AFTER_FAILURE}, not {after_failure!r}")

    def decorate(func: F) -> F:
        _check_function(func, "keyed")
        if getattr(func, COALESCED, None) is not None:
            raise TypeError(f"{func.__module__}.{func.__qualname__} has both @keyed and @coalesced: a keyed "
                            "task is one task per identity for ever, a coalesced one a task per group at a "
                            "time; choose one")
        setattr(func, _IDENTITY, Identity(identity, after_failure))
        return func

    return decorate


def claim_options(
    *, lease: float | timedelta | None = None, max_attempts: int | None = None,
    backoff: Backoff | dict[str, float] | None = None, timeout: float | timedelta | None = None,
    concurrency_key: str | Callable[..., str] | None = None, concurrency_limit: int | None = None,
) -> Callable[[F], F]:
    """Set a task's lease (seconds), ``max_attempts``, retry ``backoff`` (a ``Backoff`` or
    a dict of its fields) and ``timeout`` (seconds an attempt may run before its claim is fenced
    off and it is recorded as failed with ``TimedOut``), over the backend's ``OPTIONS`` and the
    ``TASKCLAIM_*`` settings.

    ``concurrency_key`` (a string, or a callable that gets the task's arguments and returns one)
    and ``concurrency_limit`` (N) go together: at most N tasks of one key RUNNING at once, across
    all workers of the task database (docs/django-tasks.md, "Concurrency limits")."""
    if (concurrency_key is None) != (concurrency_limit is None):
        raise InvalidArgument("claim_options: concurrency_key and concurrency_limit go together")
    if concurrency_key is not None and not callable(concurrency_key):
        concurrency_of(concurrency_key, concurrency_limit)  # a fixed key: checked now
    options = ClaimOptions(
        concurrency_key=concurrency_key,
        concurrency_limit=None if concurrency_limit is None else positive_int(concurrency_limit, "concurrency_limit"),
        timeout=None if timeout is None else timeout_seconds(timeout, "claim_options(timeout=...)"),
        lease=None if lease is None else lease_seconds(lease),
        max_attempts=None if max_attempts is None else positive_int(max_attempts, "max_attempts"),
        backoff=None if backoff is None else Backoff.of(backoff, "claim_options(backoff=...)"),
    )

    def decorate(func: F) -> F:
        _check_function(func, "claim_options")
        setattr(func, _OPTIONS, options)
        return func

    return decorate


def identity_of(func: Callable[..., Any]) -> Identity | None:
    return getattr(func, _IDENTITY, None)


def options_of(func: Callable[..., Any]) -> ClaimOptions:
    return getattr(func, _OPTIONS, None) or ClaimOptions()


def bound_call(func: Callable[..., Any], takes_context: bool, payload: Any) -> str | None:
    """The arguments of a stored call (``{"args": [...], "kwargs": {...}}``) as bound to ``func``'s
    signature, as canonical JSON: one text for every spelling of one call (by position or by
    keyword, in any order, a default left out or given). ``None`` where they do not bind.

    Defaults count: a parameter left out takes its default, where that default is a JSON value
    (a sentinel default, ``object()`` say, is left out, for every spelling alike). The context
    parameter of a task that ``takes_context`` is not an argument.
    """
    signature = _signature(func, takes_context)
    if signature is None or not isinstance(payload, dict):
        return None
    try:
        bound = signature.bind(*payload.get("args", ()), **payload.get("kwargs", {}))
    except TypeError:  # arguments the function cannot take (or a stored payload of another shape)
        return None
    arguments = dict(bound.arguments)
    for name, parameter in signature.parameters.items():
        if name not in arguments and parameter.default is not parameter.empty:
            try:
                arguments[name] = normalize_json(parameter.default)  # as an argument given would be stored
            except (TypeError, ValueError):
                continue
    try:
        return canonical_json(arguments, "arguments")
    except ValueError:
        return None


def same_call(func: Callable[..., Any], takes_context: bool) -> Callable[[Any, Any], bool]:
    """Whether two stored calls of ``func`` are one call, their arguments bound to its signature
    (:func:`bound_call`): how a keyed task's identity met again compares its arguments."""
    def same(stored: Any, given: Any) -> bool:
        mine = bound_call(func, takes_context, given)
        return mine is not None and mine == bound_call(func, takes_context, stored)

    return same


@functools.lru_cache(maxsize=1024)
def _signature(func: Callable[..., Any], takes_context: bool) -> inspect.Signature | None:
    """``func``'s signature, without the context parameter of a task that takes one."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # no signature to read (a builtin)
        return None
    parameters = list(signature.parameters.values())
    return signature.replace(parameters=parameters[1:]) if takes_context else signature


def _check_function(func: Any, name: str) -> None:
    if not callable(func) or hasattr(func, "enqueue"):
        raise TypeError(f"@{name}(...) goes under @task(): it decorates the function, not {func!r}")
