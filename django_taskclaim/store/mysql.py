"""MySQL 8 and MariaDB 10.6+: claims by conditional updates, row locks and ``SKIP LOCKED``.

Neither has ``UPDATE … RETURNING`` (MariaDB only returns from INSERT and DELETE), so a claim
is a conditional ``UPDATE`` whose row count tells whether it matched, then a read of the row
it now holds, inside one transaction: InnoDB's row lock keeps the row ours until the commit.
Django runs MySQL connections in READ COMMITTED, where a locking read or an update sees the
latest committed row, not the transaction's snapshot. The clock is ``UTC_TIMESTAMP(6)``
(fixed for the statement), compared with the naive UTC datetimes Django stores.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError

from ..status import Outcome, Status
from .rows import ATTEMPT, TASK, TASK_COLUMNS, Claimed, Moved, TaskRow
from .sql import PENDING, RELEASE_SET, RUNNING, SQLStore, claimable, owned, placeholders, word

MINIMUM_MYSQL = (8, 0, 1)  # FOR UPDATE SKIP LOCKED
MINIMUM_MARIADB = (10, 6)  # FOR UPDATE SKIP LOCKED
_DUPLICATE_KEY = 1062
_DEADLOCK = 1213


def _code(exc: Exception) -> int | None:
    cause = exc.__cause__
    args = getattr(cause, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


class MySQLStore(SQLStore):
    vendor = "mysql"
    now = "UTC_TIMESTAMP(6)"
    needs_transaction = True
    row_locks = True
    for_update = " FOR UPDATE"

    def quote(self, name: str) -> str:
        return f"`{name}`"

    def lease_sql(self) -> str:
        return f"TIMESTAMPADD(MICROSECOND, %s, {self.now})"

    def lease_param(self, seconds: float) -> int:
        return round(seconds * 1_000_000)

    def unsupported(self, connection: Any) -> str | None:
        version = tuple(connection.mysql_version)
        if connection.mysql_is_mariadb:
            if version < MINIMUM_MARIADB:
                return (f"MariaDB {'.'.join(map(str, version))} is too old: claims need MariaDB "
                        f"{'.'.join(map(str, MINIMUM_MARIADB))} or newer (FOR UPDATE SKIP LOCKED)")
        elif version < MINIMUM_MYSQL:
            return (f"MySQL {'.'.join(map(str, version))} is too old: claims need MySQL "
                    f"{'.'.join(map(str, MINIMUM_MYSQL))} or newer (FOR UPDATE SKIP LOCKED)")
        return None

    def limit_lock_waits(self, cursor: Any, seconds: float | None) -> None:
        if seconds is None:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = DEFAULT")
        else:  # whole seconds, at least 1: the variable's unit
            cursor.execute("SET SESSION innodb_lock_wait_timeout = %s", [max(1, round(seconds))])

    def retryable(self, error: Exception) -> bool:
        return _code(error) == _DEADLOCK

    def insert_columns(self) -> str:
        return ", ".join(self.quote(c) for c in TASK_COLUMNS[1:])

    def _rows_by_id(self, cursor: Any, ids: Sequence[int]) -> list[TaskRow]:
        if not ids:
            return []
        cursor.execute(f"SELECT {self.columns()} FROM {TASK} WHERE id IN ({placeholders(len(ids))}) ORDER BY id",
                       list(ids))
        return [self.decode(found) for found in cursor.fetchall()]

    def _insert(self, cursor: Any, values_sql: str, params: list[Any]) -> int | None:
        """Insert one task; its id, or ``None`` when ``(tenant, key)`` exists (a committed or
        concurrent insert: InnoDB makes the second wait for the first, then refuses it)."""
        try:
            cursor.execute(f"INSERT INTO {TASK} ({self.insert_columns()}) VALUES ({values_sql})", params)
        except IntegrityError as exc:
            if _code(exc) != _DUPLICATE_KEY:
                raise
            return None  # MySQL undoes the failed statement only: the transaction goes on
        return int(cursor.lastrowid)

    # -- claims ---------------------------------------------------------------------------
    def claim_key(
        self, cursor: Any, *, tenant: str, key: str, owner: str, lease: float, payload: str | None,
        fingerprint: str, max_attempts: int, delivery_id: str, audit: bool,
    ) -> Claimed | None:
        now, t, k = self.now, TASK, self.quote("key")
        # Take the existing row when it is claimable: a conditional UPDATE, re-checked by InnoDB
        # on the latest committed version of the row it locks.
        cursor.execute(
            f"UPDATE {t} SET status = {RUNNING}, owner = %s, fencing_token = fencing_token + 1, "
            f"attempts = attempts + 1, lease_expires_at = {self.lease_sql()}, updated_at = {now}, "
            f"payload = CASE WHEN payload_fingerprint = '' THEN %s ELSE payload END, "
            f"payload_fingerprint = CASE WHEN payload_fingerprint = '' THEN %s ELSE payload_fingerprint END "
            f"WHERE tenant = %s AND {k} = %s AND {claimable(t, now)} "
            f"AND (%s = '' OR payload_fingerprint IN ('', %s))",
            [owner, self.lease_param(lease), payload, fingerprint, tenant, key, fingerprint, fingerprint],
        )
        if cursor.rowcount == 1:
            row = self.read_task(cursor, tenant=tenant, key=key)
        else:
            # Racing inserts of one key may deadlock on the unique index (a purge deleted the
            # row they waited for): InnoDB rolls one back, and the lifecycle runs it again.
            new_id = self._insert(
                cursor,
                f"%s, %s, {RUNNING}, %s, 1, 1, %s, {self.lease_sql()}, %s, %s, NULL, '', '', NULL, {now}, {now}",
                [tenant, key, owner, max_attempts, self.lease_param(lease), payload, fingerprint],
            )
            if new_id is None:
                return None
            [row] = self._rows_by_id(cursor, [new_id])
        if row is None or row.owner != owner:
            return None
        previous = self.open_attempt(cursor, row, delivery_id) if audit else None
        return Claimed(row, previous)

    def open_attempt(self, cursor: Any, row: TaskRow, delivery_id: str) -> str | None:
        previous = None
        if row.fencing_token > 1:
            cursor.execute(
                f"SELECT owner FROM {ATTEMPT} WHERE task_id = %s AND token = %s AND outcome = {RUNNING}",
                [row.id, row.fencing_token - 1],
            )
            found = cursor.fetchone()
            if found is not None:
                previous = found[0]
                cursor.execute(
                    f"UPDATE {ATTEMPT} SET outcome = {word(Outcome.TAKEN_OVER)}, ended_at = {self.now} "
                    f"WHERE task_id = %s AND token = %s",
                    [row.id, row.fencing_token - 1],
                )
        cursor.execute(
            f"INSERT INTO {ATTEMPT} (task_id, token, owner, delivery_id, started_at, ended_at, outcome, "
            f"stale_writes) VALUES (%s, %s, %s, %s, {self.now}, NULL, {RUNNING}, 0)",
            [row.id, row.fencing_token, row.owner, delivery_id],
        )
        return previous

    def record_duplicate(self, cursor: Any, task_id: int, owner: str, delivery_id: str) -> bool:
        # A locking read of the task (READ COMMITTED reads without locks otherwise): a purge
        # deleting it is waited for, and then nothing is inserted instead of failing the key.
        cursor.execute(
            f"INSERT INTO {ATTEMPT} (task_id, token, owner, delivery_id, started_at, ended_at, outcome, "
            f"stale_writes) SELECT id, NULL, %s, %s, {self.now}, {self.now}, {word(Outcome.DUPLICATE)}, 0 "
            f"FROM {TASK} WHERE id = %s LOCK IN SHARE MODE",
            [owner, delivery_id, task_id],
        )
        return bool(cursor.rowcount == 1)

    def claim_next(
        self, cursor: Any, *, owner: str, lease: float, tenant: str | None, limit: int,
        delivery_id: str, audit: bool, exclude: int | None = None,
    ) -> list[Claimed]:
        now, t = self.now, TASK
        tparams: list[Any] = [tenant] if tenant is not None else []
        tenant_sql = "AND tenant = %s" if tenant is not None else ""
        if exclude is not None:
            tenant_sql, tparams = f"{tenant_sql} AND id <> %s", [*tparams, exclude]
        # Expired leases first (older work), then the oldest pending tasks; SKIP LOCKED so that
        # workers never queue behind each other. Locked here, updated below, in one transaction.
        cursor.execute(
            f"SELECT id FROM {t} WHERE status = {RUNNING} AND lease_expires_at < {now} "
            f"AND attempts < max_attempts {tenant_sql} ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
            [*tparams, limit],
        )
        ids = [r[0] for r in cursor.fetchall()]
        if len(ids) < limit:
            cursor.execute(
                f"SELECT id FROM {t} WHERE status = {PENDING} {tenant_sql} ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                [*tparams, limit - len(ids)],
            )
            ids += [r[0] for r in cursor.fetchall()]
        if not ids:
            return []
        cursor.execute(
            f"UPDATE {t} SET status = {RUNNING}, owner = %s, fencing_token = fencing_token + 1, "
            f"attempts = attempts + 1, lease_expires_at = {self.lease_sql()}, updated_at = {now} "
            f"WHERE id IN ({placeholders(len(ids))}) AND {claimable(t, now)}",
            [owner, self.lease_param(lease), *ids],
        )
        rows = [r for r in self._rows_by_id(cursor, ids) if r.status == Status.RUNNING and r.owner == owner]
        return [Claimed(row, self.open_attempt(cursor, row, delivery_id) if audit else None) for row in rows]

    def complete_and_claim_next(
        self, cursor: Any, task_id: int, token: int, result: str | None, result_ref: str, *, owner: str,
        lease: float, tenant: str | None, limit: int, delivery_id: str, audit: bool,
    ) -> tuple[str | None, list[Claimed]]:
        status = self.complete(cursor, task_id, token, result, result_ref, audit)
        if status is None:
            return None, []
        return status, self.claim_next(cursor, owner=owner, lease=lease, tenant=tenant, limit=limit,
                                       delivery_id=delivery_id, audit=audit, exclude=task_id)

    def ensure(
        self, cursor: Any, *, tenant: str, key: str, payload: str | None, fingerprint: str,
        max_attempts: int, dispatch: str | None,
    ) -> TaskRow | None:
        now = self.now
        new_id = self._insert(
            cursor, f"%s, %s, {PENDING}, '', 0, 0, %s, NULL, %s, %s, NULL, '', '', %s, {now}, {now}",
            [tenant, key, max_attempts, payload, fingerprint, dispatch],
        )
        if new_id is None:
            return None
        [row] = self._rows_by_id(cursor, [new_id])
        return row

    # -- an owner's writes ----------------------------------------------------------------
    def heartbeat(self, cursor: Any, task_id: int, token: int, lease: float) -> datetime | None:
        cursor.execute(
            f"UPDATE {TASK} SET lease_expires_at = {self.lease_sql()}, updated_at = {self.now} WHERE {owned()}",
            [self.lease_param(lease), task_id, token],
        )
        if cursor.rowcount != 1:
            return None
        cursor.execute(f"SELECT lease_expires_at FROM {TASK} WHERE {owned()}", [task_id, token])
        found = cursor.fetchone()
        return None if found is None else self.to_datetime(found[0])

    def finish(
        self, cursor: Any, task_id: int, token: int, set_sql: str, set_params: list[Any],
        outcomes: tuple[str, str], audit: bool, known: str | None = None,
    ) -> str | None:
        cursor.execute(
            f"UPDATE {TASK} SET {set_sql}, lease_expires_at = NULL, updated_at = {self.now} WHERE {owned()}",
            [*set_params, task_id, token],
        )
        if cursor.rowcount != 1:
            return None
        status = known
        if status is None:
            # fail(): the row is ours until this transaction commits; read which status it chose.
            cursor.execute(f"SELECT status FROM {TASK} WHERE id = %s", [task_id])
            status = str(cursor.fetchone()[0])
        if audit:
            self.close_attempt(cursor, task_id, token, outcomes[0] if status == Status.PENDING else outcomes[1])
        return status

    def lock(self, cursor: Any, task_id: int, token: int) -> bool:
        cursor.execute(f"SELECT 1 FROM {TASK} WHERE {owned()} FOR UPDATE", [task_id, token])
        return cursor.fetchone() is not None

    def row_free(self, cursor: Any, task_id: int) -> int | None:
        cursor.execute(f"SELECT fencing_token FROM {TASK} WHERE id = %s FOR UPDATE SKIP LOCKED", [task_id])
        found = cursor.fetchone()
        return None if found is None else int(found[0])

    # -- the sweeper and operators ---------------------------------------------------------
    def _moved(self, cursor: Any, ids: Sequence[int]) -> list[Moved]:
        return [Moved(r.id, r.key, r.tenant, r.fencing_token, r.status) for r in self._rows_by_id(cursor, ids)]

    def reclaim(self, cursor: Any, limit: int | None, audit: bool) -> list[Moved]:
        now, t = self.now, TASK
        limit_sql, params = ("LIMIT %s", [limit]) if limit is not None else ("", [])
        cursor.execute(
            f"SELECT id FROM {t} WHERE status = {RUNNING} AND lease_expires_at < {now} "
            f"ORDER BY id {limit_sql} FOR UPDATE SKIP LOCKED",
            params,
        )
        ids = [r[0] for r in cursor.fetchall()]
        if not ids:
            return []
        cursor.execute(
            f"UPDATE {t} SET {self.reclaim_set_sql(t)} WHERE id IN ({placeholders(len(ids))}) "
            f"AND status = {RUNNING} AND lease_expires_at < {now}",
            ids,
        )
        moved = [m for m in self._moved(cursor, ids) if m.status in (Status.PENDING, Status.FAILED)]
        if audit:
            self.close_running_attempts(cursor, moved, Outcome.EXPIRED)
        return moved

    def force_release(self, cursor: Any, held: Sequence[tuple[int, int]], audit: bool) -> list[Moved]:
        moved: list[Moved] = []
        for start in range(0, len(held), 400):
            chunk = held[start:start + 400]
            pairs = " OR ".join(["(id = %s AND fencing_token = %s)"] * len(chunk))
            flat = [v for pair in chunk for v in pair]
            cursor.execute(f"SELECT id FROM {TASK} WHERE status = {RUNNING} AND ({pairs}) FOR UPDATE", flat)
            ids = [r[0] for r in cursor.fetchall()]
            if not ids:
                continue
            cursor.execute(
                f"UPDATE {TASK} SET {RELEASE_SET}, lease_expires_at = NULL, updated_at = {self.now} "
                f"WHERE id IN ({placeholders(len(ids))}) AND status = {RUNNING}",
                ids,
            )
            tokens = dict(chunk)
            moved += [m._replace(token=tokens[m.id]) for m in self._moved(cursor, ids)]
        if audit:
            self.close_running_attempts(cursor, moved, Outcome.RELEASED)
        return moved


store = MySQLStore()
