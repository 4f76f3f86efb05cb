"""PostgreSQL: the store's statements bound on the server and prepared once per session.

Django's cursors bind parameters on the client (psycopg's ``ClientCursor``): every statement's
values are quoted into its text in Python, and PostgreSQL parses and plans the whole text
again, which for the fused claim statements costs more than running them. The store's
statements are few and fixed, so the lifecycle runs them on a cursor of their own
(:func:`cursor`): a server-binding psycopg cursor, still wrapped by Django (its error classes,
``execute_wrapper`` hooks and query logging apply), whose :func:`execute` prepares each
statement on first use. psycopg keeps the prepared statements of each connection, that is of
each server session: right under Django's pool too, where a wrapper gets another session at
each checkout.

``TASKCLAIM_PREPARED_STATEMENTS = False`` sends the statements unprepared (behind a pooler in
transaction mode, which hands each transaction to any session: check E010).
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError
from django.db.backends.utils import CursorWrapper
from django.utils.asyncio import async_unsafe

from ..conf import settings

_UNDEFINED_STATEMENT = "26000"  # prepared statement "…" does not exist
_DUPLICATE_STATEMENT = "42P05"  # prepared statement "…" already exists
_CHANGED_RESULT = "0A000"  # cached plan must not change result type
#: What a session's prepared statements may fail with, where preparing them afresh mends it.
_PREPARE_AGAIN = frozenset({_UNDEFINED_STATEMENT, _DUPLICATE_STATEMENT, _CHANGED_RESULT})

# While Django leaves psycopg's prepare_threshold at None (its default), psycopg prepares
# nothing, even when asked. For the store's own statements the threshold is lifted to a value no
# query reaches by repetition, so that only ``prepare=True`` prepares.
_ONLY_WHEN_ASKED = 2**62

_CURSOR_CLASS: Any = None


def _cursor_class() -> Any:
    """The psycopg cursor class for the store's statements; ``None`` where psycopg 3 is absent."""
    global _CURSOR_CLASS
    if _CURSOR_CLASS is None:
        from django.db.backends.postgresql import base

        binding = getattr(base, "ServerBindingCursor", None)  # psycopg 3 only
        if binding is None:
            _CURSOR_CLASS = False
        else:
            class StoreCursor(binding):  # type: ignore[misc, valid-type]
                """Binds on the server; :func:`execute` marks the statements to prepare."""

                #: For the next statement: ``True`` prepares it; ``False`` runs it unprepared but
                #: in view of psycopg's record of the session's statements (which forgets them
                #: when it sees a DEALLOCATE ALL); ``None``, as any server-binding cursor.
                prepare_next: bool | None = None
                #: psycopg's record of the session's statements is known to be wrong (see execute()).
                stale = False
                #: Django logs the queries (DEBUG, CaptureQueriesContext): give it each statement's text.
                shown = True

                def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
                    if self.prepare_next is None:
                        return self._shown(super().execute(query, params, **kwargs), query, params)
                    conn = self.connection
                    lifted = conn.prepare_threshold is None
                    if lifted:
                        conn.prepare_threshold = _ONLY_WHEN_ASKED
                    try:
                        done = super().execute(query, params, prepare=self.prepare_next or None, **kwargs)
                    finally:
                        if lifted:
                            conn.prepare_threshold = None
                    return self._shown(done, query, params)

                def close(self) -> None:
                    # Kept for the next statement of this session (see cursor()): Django's
                    # wrapper closes its cursor at the end of each ``with``. psycopg closes it
                    # with its connection.
                    return None

                def _shown(self, done: Any, query: Any, params: Any) -> Any:
                    # Django's query log (DEBUG, CaptureQueriesContext, debug toolbars) reads the
                    # statement from the cursor's last query, which psycopg leaves empty after a
                    # prepared execution: give it the statement, composed with its values on demand.
                    if self.shown and getattr(self, "_query", None) is None:
                        self._query = _Shown(self.connection, query, params)
                    return done

            _CURSOR_CLASS = StoreCursor
    return _CURSOR_CLASS or None


class _Shown:
    """What Django's query log reads of a cursor's last query (``.query``), composed when read."""

    def __init__(self, connection: Any, sql: Any, params: Any) -> None:
        self.connection, self.sql, self.params = connection, sql, params

    @property
    def query(self) -> bytes:
        import psycopg

        return psycopg.ClientCursor(self.connection).mogrify(self.sql, self.params).encode()


# One driver cursor per driver connection (one server session), reused by every statement of
# the store, with the time zone its timestamps load in: a psycopg cursor and its Django wrapper
# made anew for each statement weigh on the claim's client CPU (docs/profile.md). Weak keys: a
# closed connection's cursor goes with it.
_DRIVERS: weakref.WeakKeyDictionary[Any, tuple[Any, Any]] = weakref.WeakKeyDictionary()


# What each session's last claim by key met (which claim statement it sends next: see
# PostgreSQLStore.claim_key), kept with the session as its driver cursor is.
_CLAIM_HINTS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _session(cursor: Any) -> Any:
    """The driver connection (one server session) of a Django cursor or a psycopg cursor."""
    return getattr(getattr(cursor, "cursor", cursor), "connection", None)


def claim_hint(cursor: Any, default: str) -> str:
    """What the last claim by key on ``cursor``'s session met, or ``default`` before any."""
    try:
        return _CLAIM_HINTS.get(_session(cursor), default)
    except TypeError:  # a driver connection that takes no weak reference: no memory
        return default


def remember_claim(cursor: Any, hint: str) -> None:
    """Record what a claim by key on ``cursor``'s session met. Inside an atomic block, once it
    commits: a claim rolled back taught nothing (and a test's rolled-back transaction leaves
    the session as it found it)."""
    raw = _session(cursor)
    db = getattr(cursor, "db", None)

    def record() -> None:
        with contextlib.suppress(TypeError):  # a driver connection that takes no weak reference
            _CLAIM_HINTS[raw] = hint

    if db is not None and db.in_atomic_block:
        db.on_commit(record)
    else:
        record()


def set_claim_hint(cursor: Any, hint: str) -> None:
    """Make ``hint`` the claim statement ``cursor``'s session sends next, now (for tools that compare statements)."""
    _CLAIM_HINTS[_session(cursor)] = hint


@async_unsafe
def cursor(db: Any) -> Any:
    """A Django cursor on ``db`` whose driver cursor binds on the server (see the module).

    What ``db.cursor()`` does (the health check, the connection, the thread check, the
    logging wrapper when queries are logged), around this session's reused driver cursor.
    """
    factory = _cursor_class()
    if factory is None:
        return db.cursor()
    db.close_if_health_check_failed()
    raw = db.connection
    if raw is None:
        db.ensure_connection()
        raw = db.connection
    entry = _DRIVERS.get(raw)
    if entry is None or entry[0].closed:
        with db.wrap_database_errors:
            driver, zone = factory(raw), _timezone_of(raw)
            driver.adapters.register_loader("timestamptz", _fast_tz_loader(zone))
            entry = _DRIVERS[raw] = (driver, zone)
    driver, zone = entry
    if zone != db.timezone:
        # Django gives such a cursor a time zone of its own (see create_cursor): a fresh one.
        return _fresh(db, factory)
    db.validate_thread_sharing()
    driver.shown = logged = db.queries_logged
    return db.make_debug_cursor(driver) if logged else StoreCursorWrapper(driver, db)


class StoreCursorWrapper(CursorWrapper):
    """Django's cursor wrapper, with a shorter way for the store's statements: the same checks and
    error classes, ``execute_wrapper`` hooks whenever any are installed, no logging (a logging
    connection gets Django's own wrapper)."""

    def execute(self, sql: Any, params: Any = None) -> Any:
        db = self.db
        if db.execute_wrappers:
            return super().execute(sql, params)
        db.validate_no_broken_transaction()
        with db.wrap_database_errors:
            return self.cursor.execute(sql, params)

    def fetchone(self) -> Any:
        with self.db.wrap_database_errors:
            return self.cursor.fetchone()

    def fetchall(self) -> Any:
        with self.db.wrap_database_errors:
            return self.cursor.fetchall()

    def __exit__(self, *exc_info: Any) -> None:
        # Nothing to close: the driver cursor stays with its session (StoreCursor.close).
        return None


@functools.cache
def _fast_tz_loader(zone: Any) -> Any:
    """A timestamptz loader giving what Django's gives, at a fraction of its cost.

    Django loads timestamps with a subclass of psycopg's pure-Python loader (to set the
    connection's time zone), three per claim. This one calls psycopg's own loader for the
    session, compiled where psycopg has its C part, and sets the zone as Django's does.
    """
    from psycopg import adapt
    from psycopg import adapters as defaults
    from psycopg.pq import Format

    base: Any = defaults.get_loader(_timestamptz_oid(), Format.TEXT)  # psycopg's, always registered

    class FastTzLoader(adapt.Loader):
        timezone = zone

        def __init__(self, oid: int, context: Any = None) -> None:
            super().__init__(oid, context)
            self._load = base(oid, context).load

        def load(self, data: Any) -> Any:
            return self._load(data).replace(tzinfo=self.timezone)

    return FastTzLoader


def _timezone_of(raw: Any) -> Any:
    from psycopg.pq import Format

    return raw.adapters.get_loader(_timestamptz_oid(), Format.TEXT).timezone


@functools.cache
def _timestamptz_oid() -> int:
    import psycopg

    return int(psycopg.adapters.types["timestamptz"].oid)


def _fresh(db: Any, factory: Any) -> Any:
    """A new driver cursor of ours made by Django's own ``db.cursor()`` (with the time zone it
    gives): the driver's connection hands Django our class for that one call."""
    raw = db.connection
    usual, raw.cursor_factory = raw.cursor_factory, factory
    try:
        return db.cursor()
    finally:
        raw.cursor_factory = usual


def _sqlstate(exc: DatabaseError) -> str | None:
    cause = exc.__cause__
    return getattr(cause, "sqlstate", getattr(cause, "pgcode", None))


def _outside_transaction(db: Any) -> bool:
    """Whether a failed statement on ``db`` aborted no transaction (autocommit, no atomic block)."""
    return bool(db.get_autocommit()) and not db.in_atomic_block


def execute(cursor: Any, sql: str, params: Sequence[Any]) -> None:
    """Run ``sql`` on ``cursor``, prepared in its session where that applies."""
    driver = getattr(cursor, "cursor", None)
    store_cursor = _cursor_class()
    if store_cursor is None or not isinstance(driver, store_cursor) or not settings.PREPARED_STATEMENTS:
        cursor.execute(sql, params)  # not a store cursor (or preparing is off): as it is
        return
    if driver.stale:
        _forget(cursor, driver)
    try:
        _run(cursor, driver, sql, params, prepare=True)
    except DatabaseError as exc:
        # The session's prepared statements no longer fit: psycopg's record of them is wrong
        # (someone ran DEALLOCATE ALL or DISCARD ALL on a Django cursor, which psycopg does not
        # watch while Django keeps preparing off, or a pooler handed over a session that already
        # holds statements of these names: a session-mode PgBouncer with no reset query), or a
        # migration changed the type of a column they return (PostgreSQL refuses to run such a
        # plan, and the statement did nothing). Start the session's statements afresh and run
        # this one again, where the error aborted no transaction of the caller's; inside one, the
        # caller's rollback comes first, and the next statement after it starts afresh.
        if _sqlstate(exc) not in _PREPARE_AGAIN:
            raise
        if not _outside_transaction(cursor.db):
            driver.stale = True
            raise
        _forget(cursor, driver)
        _run(cursor, driver, sql, params, prepare=True)


def _forget(cursor: Any, driver: Any) -> None:
    """Drop this session's prepared statements; psycopg, which sees the DEALLOCATE ALL, forgets them."""
    _run(cursor, driver, "DEALLOCATE ALL", None, prepare=False)
    driver.stale = False


def _run(cursor: Any, driver: Any, sql: str, params: Sequence[Any] | None, *, prepare: bool) -> None:
    driver.prepare_next = prepare
    try:
        cursor.execute(sql, params)
    finally:
        driver.prepare_next = None
