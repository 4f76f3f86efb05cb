"""``fenced()``'s other databases: while the block runs, each of them refuses writes itself.

A write to a database other than the claim's would commit on its own, before the claim's
transaction and whatever becomes of it: the effect could land although the claim was fenced off,
or twice. A statement's text cannot tell every write (``/* app */ INSERT``, ``SELECT f()`` where
``f`` writes, ``DO $$ … $$``), so every statement the block sends to another database runs
read-only there (:meth:`Store.read_only`: a ``READ ONLY`` transaction or savepoint, SQLite's
``query_only``), set around that one statement and gone after it. Watched through
``connection.execute_wrapper`` on this thread's connections (raw driver cursors are not seen).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from django.db import DatabaseError, connections

from .. import routing, store
from ..exceptions import TaskClaimError


@contextmanager
def writes_only_to(alias: str, key: str, tenant: str) -> Iterator[None]:
    """Refuse every write to a database other than ``alias`` while the block runs (``TaskClaimError``
    naming both databases; the block then rolls back on ``alias`` as on any error)."""
    with routing.fencing(alias), ExitStack() as stack:
        for other in connections:
            if other != alias:
                stack.enter_context(connections[other].execute_wrapper(_watch(alias, other, key, tenant)))
        yield


def _watch(alias: str, other: str, key: str, tenant: str) -> Callable[..., Any]:
    def where(sql: str) -> str:
        return (f"fenced() of task {key!r} (tenant {tenant!r}) commits on database {alias!r}, but the block "
                f"wrote to database {other!r}: that write would commit on its own, whatever becomes of the "
                f"claim. Write the effect to {alias!r} (route its model with a database router: "
                f"django_taskclaim.routing.fenced_database()), or outside the block. Nothing was written to "
                f"{other!r}. Statement: {sql[:200]}")

    def watch(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        db = connections[other]
        if db.connection is not None and db.connection is connections[alias].connection:
            # One session with the claim's (an alias sharing its connection): the statement runs in
            # the claim's transaction and commits with it.
            return execute(sql, params, many, context)
        if _transaction_control(sql):
            # Django's own savepoints (an atomic() on the other database inside the block): they
            # change no data, and bracketing them would undo them with the bracket's savepoint.
            return execute(sql, params, many, context)
        if routing.is_write(sql):
            raise TaskClaimError(where(sql))  # plainly a write: not even sent
        guard = store.read_only(db, getattr(context.get("cursor"), "cursor", None))
        if isinstance(guard, str):
            raise TaskClaimError(
                f"fenced() of task {key!r} (tenant {tenant!r}) commits on database {alias!r}; database "
                f"{other!r} {guard}, so the block sends it nothing: a write there would commit on its own, "
                f"whatever becomes of the claim, and only the database can tell every write from a read. "
                f"Read {other!r} before or after the block. Statement: {sql[:200]}")
        try:
            with guard:
                return execute(sql, params, many, context)
        except DatabaseError as exc:
            if store.refused_write(db, exc.__cause__ or exc):
                raise TaskClaimError(where(sql)) from exc
            raise

    return watch


def _transaction_control(sql: str) -> bool:
    words = sql.split(None, 1)
    return bool(words) and words[0].upper() in _CONTROL


#: Statements that only mark or end a transaction's parts (the first word of Django's savepoint statements).
_CONTROL = frozenset({"SAVEPOINT", "RELEASE", "ROLLBACK"})

__all__ = ["writes_only_to"]
