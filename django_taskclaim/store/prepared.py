"""PostgreSQL: the store's statements PREPAREd once per server session, then EXECUTEd.

Django binds parameters on the client and never prepares (``prepare_threshold=None``, for
connection poolers), so PostgreSQL would parse and plan each claim again: planning the fused
CTE statements costs more than running them. The statements are few and fixed, so each is
prepared once per server session. ``TASKCLAIM_PREPARED_STATEMENTS = False`` turns this off
(for transaction-mode poolers, which hand each transaction to any server session: check E010).
With server-side binding (OPTIONS "server_side_binding") a statement runs as is: PostgreSQL
cannot type the parameters of an EXECUTE sent with the extended protocol ("could not determine
data type of parameter $1"), and psycopg prepares such queries itself when OPTIONS
"prepare_threshold" asks it to.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError

from ..conf import settings

# SQL text -> (statement name, PREPARE statement, EXECUTE statement with %s placeholders).
_STATEMENTS: dict[str, tuple[str, str, str]] = {}

# Names prepared in each server session, keyed by the driver's connection object (one object,
# one session). Not by Django's connection wrapper: with Django's pool (OPTIONS "pool") a wrapper
# is handed a different session at each checkout, and a session comes back to a wrapper after
# another one prepared in it. Weak keys: a closed connection's entry goes with it.
_PREPARED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_PREPARED_LOCK = threading.Lock()


def _prepared_in(raw: Any) -> set[str]:
    """The statement names prepared in the session of driver connection ``raw``."""
    with _PREPARED_LOCK:
        names = _PREPARED.get(raw)
        if names is None:
            names = _PREPARED[raw] = set()
        return names


_UNDEFINED_STATEMENT = "26000"  # prepared statement "…" does not exist
_DUPLICATE_STATEMENT = "42P05"  # prepared statement "…" already exists


def _sqlstate(exc: DatabaseError) -> str | None:
    cause = exc.__cause__
    return getattr(cause, "sqlstate", getattr(cause, "pgcode", None))


def _outside_transaction(db: Any) -> bool:
    """Whether a failed statement on ``db`` aborted no transaction (autocommit, no atomic block)."""
    return bool(db.get_autocommit()) and not db.in_atomic_block


def _binds_on_server(db: Any) -> bool:
    """Whether Django runs this connection's queries with server-side binding (Django 4.2+ option)."""
    return db.settings_dict.get("OPTIONS", {}).get("server_side_binding") is True


def _prepared_form(sql: str) -> tuple[str, str, str]:
    name = "taskclaim_" + hashlib.sha1(sql.encode(), usedforsecurity=False).hexdigest()[:20]
    parts = sql.split("%%")
    count = 0
    numbered = []
    for part in parts:
        pieces = part.split("%s")
        out = pieces[0]
        for piece in pieces[1:]:
            count += 1
            out += f"${count}{piece}"
        numbered.append(out)
    prepare_sql = f"PREPARE {name} AS {'%'.join(numbered)}"
    execute_sql = f"EXECUTE {name}({', '.join(['%s'] * count)})" if count else f"EXECUTE {name}"
    return name, prepare_sql, execute_sql


def execute(cursor: Any, sql: str, params: Sequence[Any]) -> None:
    """Run ``sql`` on ``cursor``, as a statement prepared in its session where that applies."""
    db = getattr(cursor, "db", None)  # a Django CursorWrapper; plain DB-API cursors run as is
    if db is None or not settings.PREPARED_STATEMENTS or _binds_on_server(db):
        cursor.execute(sql, params)
        return
    entry = _STATEMENTS.get(sql)
    if entry is None:
        entry = _STATEMENTS[sql] = _prepared_form(sql)
    name, prepare_sql, execute_sql = entry
    _prepare(db, name, prepare_sql)
    try:
        cursor.execute(execute_sql, params)
    except DatabaseError as exc:
        # Someone ran DISCARD ALL / DEALLOCATE on this session: prepare again, at once where
        # the failed statement aborted no transaction of the caller's, else at the next call.
        if _sqlstate(exc) != _UNDEFINED_STATEMENT:
            raise
        _prepared_in(db.connection).clear()
        if not _outside_transaction(db):
            raise
        _prepare(db, name, prepare_sql)
        cursor.execute(execute_sql, params)


def _prepare(db: Any, name: str, prepare_sql: str) -> None:
    raw = db.connection  # the driver's connection: with a pool, the session of this checkout
    prepared = _prepared_in(raw)
    if name not in prepared:
        # On the DB-API cursor: an internal, once-per-session statement that query budgets
        # (assertNumQueries) do not count.
        try:
            with db.wrap_database_errors, raw.cursor() as prep:
                prep.execute(prepare_sql)
        except DatabaseError as exc:
            # The session already has it: one a pooler handed over without DISCARD ALL (a
            # session-mode PgBouncer with an empty server_reset_query). The name is a hash of
            # the SQL, so it is this very statement. Inside a transaction the error aborted it.
            if _sqlstate(exc) != _DUPLICATE_STATEMENT or not _outside_transaction(db):
                raise
        prepared.add(name)
