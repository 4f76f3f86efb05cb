"""The public home of the claim API (``django_taskclaim.claims.Claim``, ``claim``…).

The code lives in :mod:`django_taskclaim.lifecycle`; this module keeps the documented names,
with the rows some of its calls return (``TaskRow`` from ``ensure_many``, ``Moved`` from
``reclaim_expired_rows``), so that a plug-in needs nothing from ``lifecycle`` or ``store``.
"""

from .lifecycle.api import (
    ClaimOutcome,
    claim,
    claim_next,
    coalesce_task,
    default_owner,
    ensure,
    ensure_many,
    ensure_task,
    insert_new,
    reclaim_expired,
    reclaim_expired_rows,
)
from .lifecycle.claim import Claim
from .lifecycle.execution import complete_or_fail
from .lifecycle.transitions import in_transaction
from .store.rows import Moved, TaskRow

__all__ = [
    "Claim", "ClaimOutcome", "Moved", "TaskRow", "claim", "claim_next", "coalesce_task", "complete_or_fail",
    "default_owner", "ensure", "ensure_many", "ensure_task", "in_transaction", "insert_new", "reclaim_expired",
    "reclaim_expired_rows",
]
