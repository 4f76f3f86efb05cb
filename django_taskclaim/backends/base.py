"""SQL shared by the backends, with the vendor differences as small hooks.

Every statement is parameterised; the only text put together here is fixed SQL fragments
(table names, the clock expression), never a value. The base class issues portable SQL one
statement at a time (SQLite runs it inside one write transaction opened by the caller); the
PostgreSQL backend overrides the hot paths to do the same work in one round trip.
"""

from __future__ import annotations

import datetime as dt
import json
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_datetime

TASK = "django_taskclaim_task"
ATTEMPT = "django_taskclaim_attempt"

TASK_COLUMNS = (
    "id", "tenant", "key", "status", "owner", "fencing_token", "attempts", "max_attempts",
    "lease_expires_at", "payload", "payload_fingerprint", "result", "result_ref", "error",
    "dispatch", "created_at", "updated_at",
)  # fmt: skip
JSON_COLUMNS = frozenset({"payload", "result", "dispatch"})
DATETIME_COLUMNS = frozenset({"lease_expires_at", "created_at", "updated_at"})
INSERT_COLUMNS = ", ".join(f'"{c}"' for c in TASK_COLUMNS[1:])

# A task can be claimed when it is pending, or running with an expired lease and attempts left.
# This predicate sits in the WHERE of the statement that writes the row, so the database
# re-checks it on the row version it locks: exactly one of several racing claims matches.
def claimable(table: str, now: str) -> str:
    return (
        f"({table}.status = 'pending' OR ({table}.status = 'running' "
        f"AND {table}.lease_expires_at < {now} AND {table}.attempts < {table}.max_attempts))"
    )


Row = tuple[Any, ...]


def is_duplicate(row: Row, expired: bool, fingerprint: str) -> bool:
    """A delivery that found the task held under a live lease, or done, with a compatible payload.

    (A different payload is a ``PayloadMismatch``, never a duplicate.) The PostgreSQL
    ``read_state`` statement applies the same rule in SQL when it records the row.
    """
    status, stored_fp = row[3], row[10]
    live_or_done = status == "succeeded" or (status == "running" and not expired)
    return live_or_done and (not fingerprint or stored_fp in ("", fingerprint))


class Backend:
    """Portable implementation; subclasses set the clock and may fuse statements."""

    vendor = ""
    now = ""
    json_param = "%s"
    # Whether multi-statement operations need the caller to open a transaction.
    needs_transaction = True

    # -- vendor hooks ---------------------------------------------------------------------
    def lease_sql(self) -> str:
        """SQL for ``db clock + %s seconds``; the parameter comes from :meth:`lease_param`."""
        raise NotImplementedError

    def lease_param(self, seconds: float) -> Any:
        return seconds

    def columns(self, table: str = "") -> str:
        """The task columns in ``TASK_COLUMNS`` order (qualified by ``table`` if given)."""
        prefix = f"{table}." if table else ""
        return ", ".join(f'{prefix}"{c}"' for c in TASK_COLUMNS)

    def returning(self, table: str = "") -> str:
        """What a statement that writes a task row returns: its columns, in order."""
        return self.columns(table)

    # -- conversion -----------------------------------------------------------------------
    def to_datetime(self, value: Any) -> datetime | None:
        if value is None or isinstance(value, datetime) and timezone.is_aware(value):
            return value
        parsed = value if isinstance(value, datetime) else parse_datetime(str(value))
        if parsed is not None and settings.USE_TZ and timezone.is_naive(parsed):
            parsed = timezone.make_aware(parsed, dt.UTC)
        return parsed

    def row_to_task(self, row: Row, using: str) -> Any:
        from ..models import Task

        values = []
        for column, value in zip(TASK_COLUMNS, row, strict=False):
            if column in JSON_COLUMNS and isinstance(value, str | bytes):
                value = json.loads(value)
            elif column in DATETIME_COLUMNS:
                value = self.to_datetime(value)
            values.append(value)
        return Task.from_db(using, list(TASK_COLUMNS), values)

    def begin_write(self, cursor: Any) -> None:
        """First statement of a transaction that reads before it writes (operator actions).

        Nothing to do where row locks serialise writers (PostgreSQL); SQLite overrides it.
        """

    def execute(self, cursor: Any, sql: str, params: list[Any]) -> None:
        """Run one of this app's statements; PostgreSQL runs the hot ones as prepared statements."""
        cursor.execute(sql, params)

    # -- statements ------------------------------------------------------------------------
    def upsert_claim_sql(self) -> str:
        now, t = self.now, TASK
        return (
            f"INSERT INTO {t} ({INSERT_COLUMNS}) VALUES (%s, %s, 'running', %s, 1, 1, %s, "
            f"{self.lease_sql()}, {self.json_param}, %s, NULL, '', '', NULL, {now}, {now}) "
            f'ON CONFLICT (tenant, "key") DO UPDATE SET status = \'running\', owner = excluded.owner, '
            f"fencing_token = {t}.fencing_token + 1, attempts = {t}.attempts + 1, "
            f"lease_expires_at = excluded.lease_expires_at, updated_at = excluded.updated_at, "
            f"payload = CASE WHEN {t}.payload_fingerprint = '' THEN excluded.payload ELSE {t}.payload END, "
            f"payload_fingerprint = CASE WHEN {t}.payload_fingerprint = '' "
            f"THEN excluded.payload_fingerprint ELSE {t}.payload_fingerprint END "
            f"WHERE {claimable(t, now)} AND (excluded.payload_fingerprint = '' "
            f"OR {t}.payload_fingerprint IN ('', excluded.payload_fingerprint)) "
            f"RETURNING {self.returning()}"
        )

    def claim_key(
        self, cursor: Any, *, tenant: str, key: str, owner: str, lease: float, payload: str | None,
        fingerprint: str, max_attempts: int, delivery_id: str, audit: bool,
    ) -> tuple[Row | None, str | None]:
        """Claim ``(tenant, key)``, creating it if absent. Returns the task row and the owner it was taken from."""
        cursor.execute(
            self.upsert_claim_sql(),
            [tenant, key, owner, max_attempts, self.lease_param(lease), payload, fingerprint],
        )
        row = cursor.fetchone()
        if row is None:
            return None, None
        previous = self.open_attempt(cursor, row[0], row[5], owner, delivery_id) if audit else None
        return row, previous

    def open_attempt(self, cursor: Any, task_id: int, token: int, owner: str, delivery_id: str) -> str | None:
        """Record a claim; close the attempt it took over, returning that attempt's owner."""
        cursor.execute(
            f"UPDATE {ATTEMPT} SET outcome = 'taken_over', ended_at = {self.now} "
            f"WHERE task_id = %s AND token = %s AND outcome = 'running' RETURNING owner",
            [task_id, token - 1],
        )
        previous = cursor.fetchone()
        cursor.execute(
            f"INSERT INTO {ATTEMPT} (task_id, token, owner, delivery_id, started_at, ended_at, outcome, "
            f"stale_writes) VALUES (%s, %s, %s, %s, {self.now}, NULL, 'running', 0)",
            [task_id, token, owner, delivery_id],
        )
        return previous[0] if previous else None

    def claim_next(
        self, cursor: Any, *, owner: str, lease: float, tenant: str | None, limit: int,
        delivery_id: str, audit: bool,
    ) -> list[tuple[Row, str | None]]:
        now, t = self.now, TASK
        tenant_sql, params = ("AND tenant = %s", [tenant]) if tenant is not None else ("", [])
        # Expired leases first (older work), then the oldest pending tasks.
        cursor.execute(
            f"UPDATE {t} SET status = 'running', owner = %s, fencing_token = fencing_token + 1, "
            f"attempts = attempts + 1, lease_expires_at = {self.lease_sql()}, updated_at = {now} "
            f"WHERE id IN (SELECT id FROM {t} WHERE {claimable(t, now)} {tenant_sql} "
            f"ORDER BY status = 'pending', id LIMIT %s) AND {claimable(t, now)} "
            f"RETURNING {self.returning()}",
            [owner, self.lease_param(lease), *params, limit],
        )
        rows = sorted(cursor.fetchall(), key=lambda r: r[0])
        return [
            (row, self.open_attempt(cursor, row[0], row[5], owner, delivery_id) if audit else None)
            for row in rows
        ]

    def ensure(
        self, cursor: Any, *, tenant: str, key: str, payload: str | None, fingerprint: str,
        max_attempts: int, dispatch: str | None,
    ) -> Row | None:
        """Insert a PENDING task unless ``(tenant, key)`` exists; the new row, or ``None``."""
        self.execute(
            cursor,
            f"INSERT INTO {TASK} ({INSERT_COLUMNS}) VALUES (%s, %s, 'pending', '', 0, 0, %s, NULL, "
            f"{self.json_param}, %s, NULL, '', '', {self.json_param}, {self.now}, {self.now}) "
            f'ON CONFLICT (tenant, "key") DO NOTHING RETURNING {self.returning()}',
            [tenant, key, max_attempts, payload, fingerprint, dispatch],
        )
        return cursor.fetchone()

    def heartbeat(self, cursor: Any, task_id: int, token: int, lease: float) -> Any:
        self.execute(
            cursor,
            f"UPDATE {TASK} SET lease_expires_at = {self.lease_sql()}, updated_at = {self.now} "
            f"WHERE id = %s AND status = 'running' AND fencing_token = %s RETURNING lease_expires_at",
            [self.lease_param(lease), task_id, token],
        )
        row = cursor.fetchone()
        return None if row is None else self.to_datetime(row[0])

    def finish(
        self, cursor: Any, task_id: int, token: int, set_sql: str, set_params: list[Any],
        outcomes: tuple[str, str], audit: bool,
    ) -> str | None:
        """Move a running task on, guarded by its token; returns the new status or ``None`` if fenced off.

        ``outcomes`` is the attempt outcome when the task went back to pending, and otherwise.
        """
        self.execute(
            cursor,
            f"UPDATE {TASK} SET {set_sql}, lease_expires_at = NULL, updated_at = {self.now} "
            f"WHERE id = %s AND status = 'running' AND fencing_token = %s RETURNING status",
            [*set_params, task_id, token],
        )
        row = cursor.fetchone()
        if row is None:
            return None
        if audit:
            outcome = outcomes[0] if row[0] == "pending" else outcomes[1]
            cursor.execute(
                f"UPDATE {ATTEMPT} SET outcome = %s, ended_at = {self.now} WHERE task_id = %s AND token = %s",
                [outcome, task_id, token],
            )
        return str(row[0])

    def join_callers_transaction(self, db: Any) -> None:
        """With autocommit off and no transaction open yet, open the caller's transaction now.

        Only SQLite needs it (see there); psycopg opens one before any statement itself.
        """

    def lock(self, cursor: Any, task_id: int, token: int) -> bool:
        """Inside a transaction: take the write lock if the token still owns the task."""
        # SQLite has one writer: a no-op UPDATE as the transaction's first statement takes the
        # write lock now (waiting for busy_timeout), so no one can take over before we commit.
        cursor.execute(
            f"UPDATE {TASK} SET fencing_token = fencing_token "
            f"WHERE id = %s AND status = 'running' AND fencing_token = %s",
            [task_id, token],
        )
        return bool(cursor.rowcount == 1)

    def check(self, cursor: Any, task_id: int, token: int) -> bool:
        self.execute(
            cursor,
            f"SELECT 1 FROM {TASK} WHERE id = %s AND status = 'running' AND fencing_token = %s",
            [task_id, token],
        )
        return cursor.fetchone() is not None

    def reclaim(self, cursor: Any, limit: int | None, audit: bool) -> list[Row]:
        """Expired running tasks back to pending (failed when no attempts remain); their rows."""
        now, t = self.now, TASK
        limit_sql, params = ("LIMIT %s", [limit]) if limit is not None else ("", [])
        cursor.execute(
            f"UPDATE {t} SET {self.reclaim_set_sql()} WHERE id IN (SELECT id FROM {t} "
            f"WHERE status = 'running' AND lease_expires_at < {now} ORDER BY id {limit_sql}) "
            f"AND status = 'running' AND lease_expires_at < {now} "
            f'RETURNING id, "key", tenant, fencing_token, status',
            params,
        )
        rows = cursor.fetchall()
        if audit and rows:
            cursor.executemany(
                f"UPDATE {ATTEMPT} SET outcome = 'expired', ended_at = {now} "
                f"WHERE task_id = %s AND token = %s AND outcome = 'running'",
                [[r[0], r[3]] for r in rows],
            )
        return list(rows)

    def reclaim_set_sql(self, table: str = TASK) -> str:
        # The owner is cleared with the lease; the attempt log keeps who held it.
        left = f"{table}.attempts < {table}.max_attempts"
        return (
            f"status = CASE WHEN {left} THEN 'pending' ELSE 'failed' END, "
            f"owner = CASE WHEN {left} THEN '' ELSE {table}.owner END, "
            f"error = CASE WHEN {left} THEN {table}.error ELSE 'lease expired with no attempts left' END, "
            f"lease_expires_at = NULL, updated_at = {self.now}"
        )

    def record_stale(self, cursor: Any, task_id: int, token: int) -> None:
        self.execute(
            cursor,
            f"UPDATE {ATTEMPT} SET stale_writes = stale_writes + 1 WHERE task_id = %s AND token = %s",
            [task_id, token],
        )

    def read_state(
        self, cursor: Any, *, tenant: str, key: str, owner: str, fingerprint: str, delivery_id: str,
        audit: bool, in_transaction: bool,
    ) -> tuple[Row | None, bool, bool]:
        """After a claim matched nothing: the task's row, whether its lease has expired by the
        database clock, and whether this delivery was recorded as a duplicate.

        A delivery is a duplicate when it finds the task held under a live lease, or done, and
        its payload is compatible (a mismatch is an error, not a duplicate).
        """
        self.execute(
            cursor,
            f'SELECT {self.columns()}, (lease_expires_at < {self.now}) FROM {TASK} WHERE tenant = %s AND "key" = %s',
            [tenant, key],
        )
        found = cursor.fetchone()
        if found is None:
            return None, False, False
        row, expired = found[: len(TASK_COLUMNS)], bool(found[-1])
        duplicate = is_duplicate(row, expired, fingerprint)
        if duplicate and audit and not self.record_duplicate(cursor, row[0], owner, delivery_id):
            return None, False, False  # purged between the read and the audit row
        return row, expired, duplicate

    def record_duplicate(self, cursor: Any, task_id: int, owner: str, delivery_id: str) -> bool:
        """Record a duplicate delivery; ``False`` when the task no longer exists (purged).

        One statement that inserts only while the task row exists: a purge that deleted the
        task since it was read makes this insert nothing instead of violating the foreign key.
        """
        self.execute(
            cursor,
            f"INSERT INTO {ATTEMPT} (task_id, token, owner, delivery_id, started_at, ended_at, outcome, "
            f"stale_writes) SELECT id, NULL, %s, %s, {self.now}, {self.now}, 'duplicate', 0 "
            f"FROM {TASK} WHERE id = %s",
            [owner, delivery_id, task_id],
        )
        return bool(cursor.rowcount == 1)
