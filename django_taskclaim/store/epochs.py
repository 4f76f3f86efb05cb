"""The layout of an epoch's fencing tokens (DESIGN §13): the one place its numbers live.

A token is ``epoch * 2**32 + n``: ``n`` counts one task's claims within the epoch (1 to 2**32 - 1),
and every token of epoch ``E`` is above every token of an earlier epoch. A claim's new token is the
larger of "one more" and the first of the current epoch, in the claim's own statement, so tokens only
grow and a token lost with a failed primary is never handed out again by a promoted one.

- PostgreSQL: ``epoch = (timeline - 1) * 2**11 + bumps``; the timeline is the server's (the first 8
  hex digits of the current WAL file's name), larger after every promotion; ``bumps`` count
  ``taskclaim_epoch --bump`` on that timeline only. A server never promoted nor bumped (timeline 1)
  hands out the tokens it did before epochs. Bounds: timelines up to 2**20, 2**11 - 1 bumps per
  timeline.
- MySQL/MariaDB and SQLite: ``epoch = bumps`` (up to 2**31 - 1), raised by ``--bump`` only; a bump
  starts above the epoch of every token in the table too, so a bump lost with the old primary is
  made good where any of its tokens reached the new one.
- The edge is an error that names it, never a wrap: a claim past a task's 2**32 - 1 tokens of one
  epoch (the constraint ``taskclaim_task_token_within_its_epoch``: a token's low 32 bits are never
  0 but for a task never claimed), a timeline past the last, a bump past the last.
"""

from __future__ import annotations

from typing import NamedTuple

#: Bits of a task's claim count within an epoch: a token is ``epoch << TOKEN_BITS | n``.
TOKEN_BITS = 32
#: Bits of the bumps within one PostgreSQL timeline.
BUMP_BITS = 11
#: Bumps one PostgreSQL timeline takes; and the last epoch elsewhere (a token is a signed BIGINT).
MAX_BUMPS_PER_TIMELINE = 2**BUMP_BITS - 1
MAX_EPOCH = 2 ** (63 - TOKEN_BITS) - 1
#: The last PostgreSQL timeline with an epoch: ``(timeline - 1) << BUMP_BITS`` stays within MAX_EPOCH.
MAX_TIMELINE = 2 ** (63 - TOKEN_BITS - BUMP_BITS)
#: Claims of one task within one epoch.
TOKENS_PER_EPOCH = 2**TOKEN_BITS - 1


class EpochState(NamedTuple):
    """A store's epoch as read: ``timeline`` (PostgreSQL's; 0 elsewhere), the ``bumps`` that count,
    ``floor`` (every token of an earlier epoch is at most this; the epoch's first is ``floor + 1``)."""

    timeline: int
    bumps: int
    floor: int

    @property
    def epoch(self) -> int:
        """The epoch's number: ``floor >> TOKEN_BITS``."""
        return self.floor >> TOKEN_BITS

    @property
    def last_token(self) -> int:
        """The last token a task may get in this epoch."""
        return self.floor + TOKENS_PER_EPOCH


#: PostgreSQL's floor of the current epoch (migration 0013): plpgsql, whose plans last the session;
#: STABLE, since a timeline cannot change within a statement (a promotion ends every session).
FLOOR_FUNCTION = f"""
CREATE OR REPLACE FUNCTION taskclaim_epoch_floor() RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tl bigint := ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint;
BEGIN
    IF tl > {MAX_TIMELINE} THEN
        RAISE EXCEPTION USING ERRCODE = 'numeric_value_out_of_range',
            MESSAGE = 'django_taskclaim: timeline ' || tl || ' is past the last epoch (timeline {MAX_TIMELINE})';
    END IF;
    RETURN (tl - 1) * {2 ** (TOKEN_BITS + BUMP_BITS)}
        + COALESCE((SELECT e.bumps FROM django_taskclaim_epoch e WHERE e.id = 1 AND e.timeline = tl), 0)
        * {2 ** TOKEN_BITS};
END
$$
"""
