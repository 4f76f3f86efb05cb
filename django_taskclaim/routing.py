"""Tenants spread over several databases: which database holds a tenant's tasks.

``TASKCLAIM_ROUTER`` names a callable ``router(tenant) -> alias``; ``TASKCLAIM_DATABASES``
lists every alias it may return. A task lives in its tenant's database, so every statement
about one task (its claim, its owner's writes, the effects its ``fenced()`` block commits) runs
on one database and exactly-one-winner stays a single-row decision there. Without a router
every tenant is in ``TASKCLAIM_DATABASE``, as with one database.

Calls without a tenant (``claim_next()``, ``reclaim_expired()``, the commands, the metrics)
visit every task database; ``claim_next()`` starts its round at a different one on each call
(:func:`rotation`), so that a busy database never starves the others.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import NoReturn

from django.db import InterfaceError, OperationalError, connections

from . import outages
from .conf import settings
from .exceptions import DatabaseUnreachable, TaskClaimError

#: Errors of a database that cannot be reached (stopped, restarting, failing over).
UNREACHABLE = (OperationalError, InterfaceError)

_turn = itertools.count()
_fenced: ContextVar[str | None] = ContextVar("taskclaim_fenced_database", default=None)
# What a fenced() block may not send to another database: statements that change data or schema.
_WRITES = frozenset({"INSERT", "UPDATE", "DELETE", "REPLACE", "MERGE", "TRUNCATE", "COPY", "CREATE",
                     "ALTER", "DROP", "GRANT", "REVOKE", "CALL"})
_MODIFYING = re.compile(r"\b(INSERT|UPDATE|DELETE|MERGE)\b", re.IGNORECASE)


def route(tenant: str, using: str | None = None) -> str:
    """The database alias that holds ``tenant``'s tasks.

    ``using`` (a caller's explicit alias, ``Task.objects.db_manager(alias)``) is taken as it is
    without a router; with one it must be the tenant's database: a task claimed in two databases
    would have two owners, so the disagreement raises ``TaskClaimError`` before anything is sent.
    """
    router = settings.ROUTER
    if router is None:
        return using or settings.DATABASE
    alias = router(tenant)
    if alias not in settings.DATABASES:
        raise TaskClaimError(
            f"TASKCLAIM_ROUTER sent tenant {tenant!r} to database {alias!r}, which is not one of "
            f"TASKCLAIM_DATABASES ({', '.join(map(repr, settings.DATABASES))})")
    if using is not None and using != alias:
        raise TaskClaimError(
            f"tenant {tenant!r} lives in database {alias!r} (TASKCLAIM_ROUTER), not in {using!r}: its "
            "tasks are claimed there only, or one task could have an owner in each database")
    return alias


def databases(using: str | None = None) -> tuple[str, ...]:
    """The task databases a call without a tenant covers: ``using`` alone when given, else every one."""
    return (using,) if using else settings.DATABASES


def rotation(using: str | None = None) -> tuple[str, ...]:
    """:func:`databases`, starting at the next one on each call (round robin, per process)."""
    found = databases(using)
    if len(found) < 2:
        return found
    start = next(_turn) % len(found)
    return found[start:] + found[:start]


def several() -> bool:
    """Whether the tasks are spread over more than one database."""
    return len(settings.DATABASES) > 1


def cannot_reach(alias: str) -> bool:
    """Whether an error just met on task database ``alias`` means it could not be connected to, one
    of several task databases (the others can go on); ``False`` with one database, or once connected
    (the statement's own error, to be raised as it is)."""
    return several() and connections[alias].connection is None


@contextmanager
def reaching(alias: str) -> Iterator[None]:
    """Reads of task database ``alias``: where it is one of several and cannot be connected to,
    ``DatabaseUnreachable`` naming it (the driver's error as its cause), not the bare driver error;
    any other error is raised as it is."""
    try:
        yield
    except UNREACHABLE as exc:
        if not cannot_reach(alias):
            raise
        raise DatabaseUnreachable(alias, f"cannot be reached: {outages.one_line(exc)}") from exc


def named(error: BaseException, alias: str, tenant: str | None = None) -> BaseException | None:
    """``error`` of task database ``alias`` again, its message naming which of several task
    databases could not be connected to (and for which tenant), of the same class (an
    ``OperationalError`` stays one, so workers wait and try again). ``None`` with one database,
    or once connected (the statement's own error, to be raised as it is)."""
    if not cannot_reach(alias):
        return None
    whose = f" (tenant {tenant!r})" if tenant is not None else ""
    found = type(error)(f"task database {alias!r}{whose} cannot be reached: {outages.one_line(error)}")
    found.taskclaim_alias = alias  # type: ignore[attr-defined]  # names its database (outages.describe)
    found.__cause__ = error
    return found


def unreachable(error: BaseException, alias: str, tenant: str | None = None) -> NoReturn:
    """Raise ``error`` again, named by :func:`named` where it says so."""
    found = named(error, alias, tenant)
    if found is None:
        raise error
    raise found from error


def fenced_database() -> str | None:
    """Inside ``claim.fenced()``: the alias of the claim's database, where the block's writes
    commit with the claim; ``None`` outside. A Django database router returns it for the models a
    fenced block writes (docs/configurations.md, "Tenants over several databases")."""
    return _fenced.get()


def is_write(sql: str) -> bool:
    """Whether a statement's first word says that it changes data or schema (``SELECT … FOR UPDATE``
    only locks). ``fenced()`` refuses these before they are sent; the first word cannot tell every
    write (a leading comment, ``SELECT f()`` where ``f`` writes), so the other database refuses the
    rest itself (lifecycle/readonly.py)."""
    words = sql.lstrip(" \t\r\n(").split(None, 1)
    if not words:
        return False
    first = words[0].upper()
    return first in _WRITES or (first == "WITH" and _MODIFYING.search(sql) is not None)


@contextmanager
def fencing(alias: str) -> Iterator[None]:
    """While the block runs, :func:`fenced_database` is ``alias`` (``claim.fenced()``'s database)."""
    token = _fenced.set(alias)
    try:
        yield
    finally:
        _fenced.reset(token)


__all__ = ["UNREACHABLE", "cannot_reach", "databases", "fenced_database", "fencing", "is_write", "named", "reaching",
           "rotation", "route", "several", "unreachable"]
