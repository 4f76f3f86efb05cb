"""A claim's progress write (``Claim.progress()``): fenced as every write of a claim, by the task's
status and the claim's token in the statement itself."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..store import get_store
from . import transitions

if TYPE_CHECKING:
    from ..store.sql import SQLStore


def write(holder: Any, fraction: float, note: str) -> bool:
    """Store ``fraction`` and ``note`` as the task's progress, with the holder's token, if the
    holder's claim still holds the task: whether it did (``False``: fenced off, nothing written).
    Inside the caller's transaction it commits with it; sent again on a dropped connection, as a
    heartbeat is (writing the same values twice changes nothing)."""
    store = cast("SQLStore", get_store(holder.using))  # every store is one: its statements by name

    def run(cursor: Any) -> bool:
        store.execute(cursor, store.sql("set_progress"),
                      [fraction, note, holder.token, holder.task_id, holder.token])
        return bool(cursor.rowcount == 1)

    return transitions._reconnecting(holder.using, lambda: transitions._plain(holder.using, run))
