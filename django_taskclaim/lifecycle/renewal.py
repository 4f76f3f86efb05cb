"""Leases renewed together: one statement a round for every claim a process keeps alive in one
task database, rather than a heartbeat thread (and a statement) per claim.

A claim marked ``renew_together`` (a worker running several tasks at once sets it on each) joins
its database's :class:`_Renewal` for the length of its ``keepalive()`` block instead of getting a
heartbeat thread of its own. The renewal's one thread wakes when the soonest claim is due and
renews, in one statement per lease length, every claim due within half an interval (renewing early
is harmless: the lease counts from the database's now), so that claims that started at different
moments fall into the same rounds. A claim whose ``(id, token)`` the statement did not renew was
taken over: it alone is marked lost (``claim.lost``, the ``heartbeat_lost`` signal), exactly as a
refused heartbeat of its own thread would; the others go on. A database out of reach loses each
claim only once its lease has surely run out by this process's clock.

Only blocks outside a transaction join: inside one, the keepalive's own thread knows the rules of
a row the caller's transaction holds (:mod:`~django_taskclaim.lifecycle.keepalive`).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import defaultdict
from datetime import datetime
from typing import Any, Protocol

from django.db import Error as DbError
from django.db import connections

from ..exceptions import StaleClaim
from . import transitions


class KeepaliveMixin(Protocol):
    """What a renewal needs of a claim (:class:`~django_taskclaim.lifecycle.keepalive.KeepaliveMixin`
    provides it): named here, not imported, so that keepalive, which calls this module, stays the
    only arrow between the two."""

    task_id: int
    key: str
    tenant: str
    token: int
    owner: str
    lease: float
    using: str
    lease_expires_at: datetime | None
    _finishing: bool
    _deadline: float

    def _lose(self, exc: BaseException) -> None: ...
    def named(self) -> str: ...
    def log_extra(self) -> dict[str, Any]: ...

logger = logging.getLogger("django_taskclaim")


class Member:
    """One claim's place in its database's renewal, for the length of a keepalive block."""

    __slots__ = ("claim", "due", "ended", "every", "renewal")

    def __init__(self, renewal: _Renewal, claim: KeepaliveMixin, every: float) -> None:
        self.renewal, self.claim, self.every = renewal, claim, every
        # As a heartbeat thread's first beat: one interval after the claim was made.
        self.due = claim._deadline - claim.lease + every
        self.ended = False

    def end(self, join: bool = True) -> None:
        """The block is over: renewed no more (a round under way may still renew it once)."""
        self.renewal.leave(self)


class _Renewal:
    """The claims kept alive in task database ``using`` by this process, and their one thread."""

    def __init__(self, using: str) -> None:
        self.using = using
        self.cond = threading.Condition(threading.Lock())
        self.members: dict[int, Member] = {}
        self.thread: threading.Thread | None = None
        # When the thread looks at its members next: the end of its wait (inf: until notified),
        # -inf while it is not waiting. A member due later needs no wake-up (most join a busy
        # renewal with a due time after the soonest one's), so joining costs no thread switch.
        self.wakes_at = -math.inf

    def join(self, claim: KeepaliveMixin, every: float) -> Member:
        member = Member(self, claim, every)
        with self.cond:
            self.members[id(member)] = member
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, daemon=True,
                                               name=f"taskclaim-renewal-{self.using}")
                self.thread.start()
            if member.due < self.wakes_at:  # due sooner than the thread would look
                self.wakes_at = member.due
                self.cond.notify()
        return member

    def leave(self, member: Member) -> None:
        with self.cond:
            member.ended = True
            self.members.pop(id(member), None)

    def _run(self) -> None:
        while True:
            with self.cond:
                while True:
                    soonest = min((m.due for m in self.members.values()), default=math.inf)
                    delay = soonest - time.monotonic()
                    if delay <= 0:
                        break
                    if soonest == math.inf:  # nothing to keep alive: hold no session meanwhile
                        connections[self.using].close()
                    self.wakes_at = soonest
                    self.cond.wait(None if soonest == math.inf else delay)
                    self.wakes_at = -math.inf
                now = time.monotonic()
                due = [m for m in self.members.values() if m.due - m.every / 2 <= now]
                for member in due:  # not looked at again before this round has answered
                    member.due = math.inf
            try:
                self._round(due)
            except Exception:  # never let the renewal thread die: its claims would all run out
                logger.exception("lease renewal round failed")
                for member in due:
                    member.due = time.monotonic() + member.every

    def _round(self, due: list[Member]) -> None:
        """Renew ``due``: one statement for each lease length among them."""
        by_lease: dict[float, list[Member]] = defaultdict(list)
        for member in due:
            by_lease[member.claim.lease].append(member)
        for lease, members in by_lease.items():
            sent = time.monotonic()
            try:
                renewed = transitions.heartbeat_many(
                    self.using, [(m.claim.task_id, m.claim.token) for m in members], lease)
            except DbError as exc:
                self._unanswered(members, exc)
                continue
            for member in members:
                claim = member.claim
                expires = renewed.get(claim.task_id)
                if expires is not None:
                    claim.lease_expires_at, claim._deadline = expires, sent + lease
                    member.due = sent + member.every
                elif not (member.ended or claim._finishing):  # taken over: this claim alone is lost
                    self._lose(member, StaleClaim(claim.key, claim.tenant, claim.token, "heartbeat"))

    def _unanswered(self, members: list[Member], exc: DbError) -> None:
        """The database did not answer: try again next interval; a claim whose lease has surely run
        out by now (this process's clock) is lost."""
        logger.warning("lease renewal of %d claims failed: %s", len(members), exc)
        connections[self.using].close_if_unusable_or_obsolete()  # a dropped session: a new one next time
        now = time.monotonic()
        for member in members:
            if now >= member.claim._deadline and not member.ended:
                self._lose(member, exc)
            else:
                member.due = now + member.every

    def _lose(self, member: Member, exc: BaseException) -> None:
        self.leave(member)
        claim = member.claim
        if isinstance(exc, StaleClaim):
            try:
                transitions.refuse(claim, "heartbeat")  # the audit's count of a refused write, as a heartbeat's
            except DbError:
                logger.warning("a refused renewal could not be counted: %s", claim.named(), extra=claim.log_extra())
        claim._lose(exc)


_RENEWALS: dict[str, _Renewal] = {}
_RENEWALS_LOCK = threading.Lock()


def _forget_renewals() -> None:
    global _RENEWALS, _RENEWALS_LOCK  # a forked child has none of its parent's threads
    _RENEWALS, _RENEWALS_LOCK = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_renewals)


def join(claim: KeepaliveMixin, every: float) -> Member:
    """Keep ``claim`` alive every ``every`` seconds with the other claims of its database."""
    with _RENEWALS_LOCK:
        renewal = _RENEWALS.get(claim.using)
        if renewal is None:
            renewal = _RENEWALS[claim.using] = _Renewal(claim.using)
    return renewal.join(claim, every)
