"""The lifecycle of a task: every transition (``transitions``), the claim a worker holds
(``handle``, with ``keepalive`` and its awaitable twins), and the claim API (``api``)."""

from .api import (
    ClaimOutcome,
    claim,
    claim_next,
    complete_or_fail,
    default_owner,
    ensure,
    ensure_task,
    reclaim_expired,
    reclaim_expired_rows,
)
from .handle import Claim
from .transitions import in_transaction

__all__ = [
    "Claim", "ClaimOutcome", "claim", "claim_next", "complete_or_fail", "default_owner", "ensure",
    "ensure_task", "in_transaction", "reclaim_expired", "reclaim_expired_rows",
]
