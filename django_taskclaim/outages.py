"""Task databases out of reach, as this process last met them: one message, one log line per change.

A worker that polls a database that is down would log the driver's multi-line error on every
poll; a command would print it with the database named twice. Every place that meets a task
database out of reach (or answering again) says so here: :func:`describe` is the one-line message
that names the database once, :func:`down` and :func:`up` log a change of state once: a database
down at most once every :data:`MIN_GAP` seconds (a flapping database's changes in between are not
said), and its answering again once after each line that said it was down.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

logger = logging.getLogger("django_taskclaim")

#: The least time between two log lines about one database's state.
MIN_GAP = 10.0


@dataclass
class _Seen:
    down: bool = False  # as last met
    reason: str = ""
    logged_down: bool = False  # as the last line said
    down_logged_at: float = float("-inf")  # when a line last said it was down


_lock = threading.Lock()
_seen: dict[str, _Seen] = {}


def one_line(error: BaseException) -> str:
    """The error's message on one line (libpq's spans several), or its class when it has none."""
    return " ".join(str(error).split()) or type(error).__name__


def describe(alias: str, error: BaseException) -> str:
    """``task database 'ALIAS' cannot be reached: REASON``, on one line, the database named once
    (an error that names it already, such as ``DatabaseUnreachable``, is said as it is)."""
    if getattr(error, "taskclaim_alias", None) == alias:
        return one_line(error)
    return f"task database {alias!r} cannot be reached: {one_line(error)}"


def down(alias: str, error: BaseException) -> str:
    """Note that ``alias`` could not be reached; log it if that is a change (see module). Returns
    :func:`describe`'s message."""
    message = describe(alias, error)
    with _lock:
        seen = _seen.setdefault(alias, _Seen())
        seen.down, seen.reason = True, message
        _log(alias, seen)
    return message


def up(alias: str) -> None:
    """Note that ``alias`` answered; log it if it was said to be down (see module)."""
    seen = _seen.get(alias)
    if seen is None or (not seen.down and not seen.logged_down):
        return  # the common case, without the lock: never down, or its recovery said already
    with _lock:
        seen.down = False
        _log(alias, seen)


def is_down(alias: str) -> bool:
    """Whether ``alias`` was out of reach when this process last met it."""
    seen = _seen.get(alias)
    return seen is not None and seen.down


def _log(alias: str, seen: _Seen) -> None:
    if seen.down == seen.logged_down:
        return
    if not seen.down:
        logger.warning("task database %r answers again", alias, extra={"database": alias})
    elif (now := time.monotonic()) - seen.down_logged_at >= MIN_GAP:
        logger.warning("%s; its tenants wait, the other task databases go on", seen.reason,
                       extra={"database": alias})
        seen.down_logged_at = now
    else:
        return  # down again within MIN_GAP of the last line that said so: not said
    seen.logged_down = seen.down


def forget() -> None:
    """Forget every database's state (tests)."""
    with _lock:
        _seen.clear()


__all__ = ["MIN_GAP", "describe", "down", "forget", "is_down", "one_line", "up"]
