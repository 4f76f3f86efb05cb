"""The public home of the claim API (``django_taskclaim.claims.Claim``, ``claim``…).

The code lives in :mod:`django_taskclaim.lifecycle`; this module keeps the documented names.
"""

from .lifecycle import (
    Claim,
    ClaimOutcome,
    claim,
    claim_next,
    complete_or_fail,
    default_owner,
    ensure,
    ensure_task,
    in_transaction,
    reclaim_expired,
    reclaim_expired_rows,
)

__all__ = [
    "Claim", "ClaimOutcome", "claim", "claim_next", "complete_or_fail", "default_owner", "ensure",
    "ensure_task", "in_transaction", "reclaim_expired", "reclaim_expired_rows",
]
