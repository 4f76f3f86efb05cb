"""A claim's progress write (``Claim.progress()``): fenced as every write of a claim, by the task's
status and the claim's token in the statement itself."""

from __future__ import annotations

from typing import Any

from ..store import get_store
from . import transitions


def write(holder: Any, fraction: float, note: str) -> bool:
    """Store ``fraction`` and ``note`` as the task's progress, with the holder's token, if the
    holder's claim still holds the task: whether it did (``False``: fenced off, nothing written).
    Inside the caller's transaction it commits with it; sent again on a dropped connection, as a
    heartbeat is (writing the same values twice changes nothing)."""
    store = get_store(holder.using)
    return transitions._reconnecting(holder.using, lambda: transitions._plain(
        holder.using, lambda cursor: store.set_progress(cursor, holder.task_id, holder.token, fraction, note)))
