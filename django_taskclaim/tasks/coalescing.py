"""``@coalesced``: enqueues of one group while its task waits become that task (Oban, rq and
Hatchet users' "one running, one queued"). The decorator sets an attribute on the function, as
``keyed`` does, and checks its options when the task is declared; the backend asks
:func:`coalescing_of` at enqueue and the claim API (``claims.coalesce_task``) decides atomically."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from ..exceptions import InvalidArgument
from ..values import MAX_GROUP_LENGTH, coalesce_seconds, group_name
from .identity import COALESCED, _check_function, identity_of

F = TypeVar("F", bound=Callable[..., Any])

#: The longest ``delay`` or ``max_delay``: 30 days, as ``OPTIONS["IMPORT_GRACE"]``.
MAX_DELAY = 30 * 86400.0

__all__ = ["MAX_DELAY", "MAX_GROUP_LENGTH", "Coalescing", "coalesced", "coalescing_of", "group_for"]


@dataclass(frozen=True)
class Coalescing:
    """A task's coalescing: ``of(*args, **kwargs)`` names the group; seconds of ``delay`` after
    each enqueue, at most ``max_delay`` after the first (``None``: no cap)."""

    of: Callable[..., str]
    delay: float = 0.0
    max_delay: float | None = None


def coalesced(group: Callable[..., str], *, delay: float | timedelta = 0,
              max_delay: float | timedelta | None = None) -> Callable[[F], F]:
    """Coalesce a task's enqueues by ``group`` (a callable of the task's arguments returning a string).

    While the group's task waits (enqueued, not started), an ``enqueue`` of the group is that task:
    its arguments replace the stored ones (the newest, by commit order, win), its "not before" time
    moves to now + ``delay`` (seconds, by the database clock) but never past its first enqueue +
    ``max_delay``, and the caller gets its result id. While it runs, the next ``enqueue`` queues one
    follow-up task, which takes the enqueues after it the same way; once it started, a new one.

        @task()
        @coalesced(lambda doc_id: f"reindex:{doc_id}", delay=2, max_delay=30)
        def reindex(doc_id): ...

    ``delay``/``max_delay`` that are negative, longer than 30 days, or ``max_delay < delay`` raise
    ``InvalidArgument`` here; a task that is also ``@keyed`` raises ``TypeError`` (an identity is one
    task for ever; a group is one task at a time). See docs/django-tasks.md, "Coalescing".
    """
    if not callable(group):
        raise TypeError(f"coalesced() needs a callable that returns the group's name, not {group!r}")
    wait = _seconds(delay, "delay")
    cap = None if max_delay is None else _seconds(max_delay, "max_delay")
    if cap is not None and cap < wait:
        raise InvalidArgument(f"coalesced(): max_delay ({cap:g} s) is shorter than delay ({wait:g} s): "
                              "the task could never wait its delay")
    coalescing = Coalescing(group, wait, cap)

    def decorate(func: F) -> F:
        _check_function(func, "coalesced")
        if identity_of(func) is not None:
            raise TypeError(f"{_name(func)} has both @keyed and @coalesced: a keyed task is one task per "
                            "identity for ever, a coalesced one a task per group at a time; choose one")
        setattr(func, COALESCED, coalescing)
        return func

    return decorate


def coalescing_of(func: Callable[..., Any]) -> Coalescing | None:
    """The task function's :class:`Coalescing`, or ``None``."""
    return getattr(func, COALESCED, None)


def group_for(task: Any, coalescing: Coalescing, args: Any, kwargs: Any) -> str:
    """The group of one call of ``task``, checked: ``InvalidArgument`` naming the task and the
    value for anything but a string of 1 to :data:`MAX_GROUP_LENGTH` printable characters."""
    value = coalescing.of(*args, **kwargs)
    try:
        return group_name(value)
    except InvalidArgument as exc:
        raise InvalidArgument(f"coalesced task {task.module_path!r}: its group function returned {value!r:.80}, "
                              f"and {exc}") from None


def _seconds(value: Any, name: str) -> float:
    return coalesce_seconds(value, f"coalesced(): {name}", MAX_DELAY)


def _name(func: Any) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', func)!s}"
