"""SQLite: the portable statements, run one at a time inside a write transaction.

SQLite has a single writer. Each multi-statement operation runs in a transaction whose first
statement is a write, so it takes the write lock before it reads anything: a transaction that
read first and wrote later could deadlock with another writer, or fail on a stale snapshot.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage
from django.db import OperationalError

from ..checkspec import spec
from .sql import SQLStore

MINIMUM_VERSION = (3, 35)  # UPDATE … RETURNING
#: Seconds a SQLite connection waits for the write lock before "database is locked": with
#: several queue workers on one file, Django's default of 5 s is not enough (docs/databases.md).
RECOMMENDED_TIMEOUT = 30.0
DEFAULT_TIMEOUT = 5.0  # Python's sqlite3.connect() default, which Django keeps
W020 = spec("django_taskclaim.W020", "SQLite database {alias!r} waits {timeout} for a lock before "
            "\"database is locked\".",
            "Set DATABASES[{alias!r}]['OPTIONS']['timeout'] = 30 (seconds) or more: SQLite has one "
            "writer, and with several workers (claim_next, fenced(), run_once) a writer can wait "
            "longer than the default 5 s for its turn.")


class SQLiteStore(SQLStore):
    vendor = "sqlite"
    naive_datetimes = "SQLite"
    # UTC in the text form Django stores datetimes in (six fraction digits), because SQLite
    # compares these columns as text. Its clock has millisecond resolution.
    now = "(strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')"

    def lease_sql(self) -> str:
        return "(strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000')"

    def lease_param(self, seconds: float) -> str:
        return f"{seconds:+.3f} seconds"

    def unsupported(self, connection: Any) -> str | None:
        if sqlite3.sqlite_version_info < MINIMUM_VERSION:
            return (f"SQLite {sqlite3.sqlite_version} is too old: claims need SQLite "
                    f"{'.'.join(map(str, MINIMUM_VERSION))} or newer (UPDATE … RETURNING)")
        return None

    def system_check(self, alias: str, connection: Any) -> list[CheckMessage]:
        found = super().system_check(alias, connection)
        # The settings as they are now (override_settings changes these, not the connection's copy).
        database: dict[str, Any] = settings.DATABASES[alias]
        options: dict[str, Any] = database.get("OPTIONS") or {}
        timeout = options.get("timeout", DEFAULT_TIMEOUT)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            found.append(W020.warning(alias=alias, timeout=f"{timeout!r} (not a number of seconds)"))
        elif timeout < RECOMMENDED_TIMEOUT:
            default = " (the default)" if "timeout" not in options else ""
            found.append(W020.warning(alias=alias, timeout=f"{timeout:g} s{default}"))
        return found

    def record_duplicate(self, cursor: Any, task_id: int, owner: str, delivery_id: str) -> bool:
        options: dict[str, Any] = cursor.db.settings_dict.get("OPTIONS") or {}
        usual = float(options.get("timeout", DEFAULT_TIMEOUT))  # what Django gave sqlite3.connect()
        cursor.execute(f"PRAGMA busy_timeout = {int(min(usual, self.duplicate_record_wait) * 1000)}")
        try:
            return super().record_duplicate(cursor, task_id, owner, delivery_id)
        except OperationalError as exc:
            if "locked" not in str(exc):
                raise
            return True  # the write lock stayed held (an owner's fenced(), a long transaction): left out
        finally:
            cursor.execute(f"PRAGMA busy_timeout = {int(usual * 1000)}")

    def begin_write(self, cursor: Any) -> None:
        # A deferred transaction that reads first holds a shared lock (or, in WAL mode, a
        # snapshot) and cannot upgrade it while another connection writes: SQLite returns
        # SQLITE_BUSY at once, without waiting for the busy timeout ("database is locked").
        # A write that matches nothing, as the first statement, takes the write lock now and
        # waits for it like any other write. (Django 5.1+ can do this for every transaction
        # with OPTIONS={"transaction_mode": "IMMEDIATE"}.)
        cursor.execute(self.sql("begin_write"))

    def join_callers_transaction(self, db: Any) -> None:
        # With autocommit off, Python's sqlite3 opens a transaction only before a write. An
        # atomic() block entered first would issue SAVEPOINT outside a transaction, which SQLite
        # treats as BEGIN, and its RELEASE as COMMIT: the caller's commit or rollback would come
        # too late. Open the transaction, so that the savepoint nests inside it.
        if not db.connection.in_transaction:
            with db.wrap_database_errors:
                db.connection.execute("BEGIN")

    def limit_lock_waits(self, cursor: Any, seconds: float | None) -> None:
        # A keepalive thread's own connection, closed for good afterwards: nothing to restore.
        if seconds is not None:
            cursor.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")

    # -- fenced()'s other databases --------------------------------------------------------
    def read_only(self, db: Any, cursor: Any) -> AbstractContextManager[None] | str:
        return _query_only(db.connection)

    def refused_write(self, error: BaseException) -> bool:
        code = getattr(error, "sqlite_errorcode", None)  # the extended code: its low byte is the primary one
        return code is not None and code & 0xFF == sqlite3.SQLITE_READONLY


@contextmanager
def _query_only(raw: Any) -> Iterator[None]:
    """One statement with ``PRAGMA query_only`` on (a setting of the connection, in or out of a
    transaction), then back to what it was."""
    was = raw.execute("PRAGMA query_only").fetchone()[0]
    raw.execute("PRAGMA query_only = 1")
    try:
        yield
    finally:
        raw.execute("PRAGMA query_only = 1" if was else "PRAGMA query_only = 0")


store = SQLiteStore()

