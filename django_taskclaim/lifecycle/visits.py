"""``claim_next()`` over several task databases: each one visited on a thread of its own, and waited
for at most ``TASKCLAIM_DATABASE_TIMEOUT``.

A hung server (stopped by SIGSTOP, a frozen virtual machine) answers neither with an error nor
within any socket timeout: its kernel still accepts the connection and acknowledges what is sent,
so a statement sent to it waits for ever. Visited on the caller's thread, such a database would
stop ``claim_next()`` for the tenants of every database. Visited on a thread of its own (with a
connection of its own, closed when the visit ends), the caller waits for it at most the deadline
and goes on to the next database; while that visit is out, later calls skip the database at once.
A visit that returns after its caller gave up releases what it claimed (``release``: the attempt
is not counted), so a late claim is neither lost to a lease nor charged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import connections

from .. import routing
from ..exceptions import DatabaseUnreachable, StaleClaim
from .claim import Claim

logger = logging.getLogger("django_taskclaim")

_lock = threading.Lock()
#: alias -> the visit its caller gave up on, still out (guarded by ``_lock``).
_out: dict[str, _Visit] = {}


class _Visit:
    """One call of ``claim_next`` on one database, on a thread of its own."""

    def __init__(self, alias: str, call: Callable[[], list[Claim]]) -> None:
        self.alias, self.call = alias, call
        self.claims: list[Claim] = []
        self.error: BaseException | None = None
        self.finished = False  # the call returned (under _lock)
        self.abandoned = False  # its caller gave up waiting (under _lock)
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self.claims = self.call()
        except routing.UNREACHABLE as exc:
            # Named here, where the connection's state tells a refused connection from a statement's error.
            self.error = routing.named(exc, self.alias) or exc
        except BaseException as exc:
            self.error = exc
        with _lock:
            self.finished = True
            abandoned = self.abandoned
            if abandoned and _out.get(self.alias) is self:
                del _out[self.alias]
        try:
            if abandoned:
                _release_all(self.alias, self.claims)
        finally:
            connections.close_all()  # this thread's connections only
            self.done.set()


def visit(alias: str, call: Callable[[], list[Claim]], deadline: float) -> list[Claim]:
    """``call()`` (a claim in database ``alias``) on a thread of its own: its claims, or its error.

    ``DatabaseUnreachable`` when it did not end within ``deadline`` seconds, or when the visit of an
    earlier call that did not is still out.
    """
    with _lock:
        if alias in _out:
            raise DatabaseUnreachable(alias, "has not answered a claim sent more than "
                                             f"{deadline:g} s ago (TASKCLAIM_DATABASE_TIMEOUT); skipped until it does")
    found = _Visit(alias, call)
    threading.Thread(target=found.run, name=f"taskclaim-visit-{alias}", daemon=True).start()
    if not found.done.wait(deadline):
        with _lock:
            if not found.finished:
                found.abandoned = True
                _out[alias] = found
                raise DatabaseUnreachable(alias, f"did not answer within {deadline:g} s "
                                                 "(TASKCLAIM_DATABASE_TIMEOUT); skipped until it does")
        found.done.wait()  # finished just now: only its connection is being closed
    if found.error is not None:
        raise found.error
    return found.claims


def _release_all(alias: str, claims: list[Claim]) -> None:
    """Release what a visit claimed after its caller gave up on it."""
    for claim in claims:
        try:
            claim.release()
        except (StaleClaim, *routing.UNREACHABLE) as exc:
            # Not released: the task comes back after its lease, by the rules.
            logger.warning("a late claim in task database %r could not be released: %s", alias, exc,
                           extra=claim.log_extra())


__all__ = ["visit"]
