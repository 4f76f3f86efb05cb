"""The lifecycle of a task: every transition (``transitions``), the claim a worker holds
(``handle``, with ``keepalive``), the claim API (``api``), and how work runs under a claim
(``execution``)."""

from .api import (
    ClaimOutcome,
    claim,
    claim_next,
    default_owner,
    ensure,
    ensure_many,
    ensure_task,
    reclaim_expired,
    reclaim_expired_rows,
)
from .execution import complete_or_fail, current_claim
from .handle import Claim
from .transitions import in_transaction

__all__ = [
    "Claim", "ClaimOutcome", "claim", "claim_next", "complete_or_fail", "current_claim", "default_owner",
    "ensure", "ensure_many", "ensure_task", "in_transaction", "reclaim_expired", "reclaim_expired_rows",
]
