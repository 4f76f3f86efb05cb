"""SQLite: the portable statements, run one at a time inside a write transaction.

SQLite has a single writer. Each multi-statement operation runs in a transaction whose first
statement is a write, so it takes the write lock before it reads anything: a transaction that
read first and wrote later could deadlock with another writer, or fail on a stale snapshot.
"""

from __future__ import annotations

from .base import Backend


class SQLiteBackend(Backend):
    vendor = "sqlite"
    # UTC in the text form Django stores datetimes in (six fraction digits), because SQLite
    # compares these columns as text. Its clock has millisecond resolution.
    now = "(strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')"

    def lease_sql(self) -> str:
        return "(strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000')"

    def lease_param(self, seconds: float) -> str:
        return f"+{seconds:.3f} seconds"


backend = SQLiteBackend()
