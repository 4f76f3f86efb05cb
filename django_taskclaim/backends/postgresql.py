"""PostgreSQL: the hot paths fused into one statement each with data-modifying CTEs.

A claim (insert-or-take-over plus its audit rows), a completion (task plus attempt) and a
queue claim (``FOR UPDATE SKIP LOCKED`` plus audit) are each one round trip.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from typing import Any

from django.db import DatabaseError

from ..conf import settings
from .base import ATTEMPT, INSERT_COLUMNS, TASK, TASK_COLUMNS, Backend, Row, claimable, is_duplicate

_OPEN_ATTEMPTS = (
    # Close the attempt that was taken over (token - 1 still running), open the new one, both
    # at c.claimed_at: the clock read once the row was claimed (see returning()).
    f", closed AS (UPDATE {ATTEMPT} a SET outcome = 'taken_over', ended_at = c.claimed_at "
    f"FROM claimed c WHERE a.task_id = c.id AND a.token = c.fencing_token - 1 AND a.outcome = 'running' "
    f"RETURNING a.task_id, a.owner), "
    f"opened AS (INSERT INTO {ATTEMPT} (task_id, token, owner, delivery_id, started_at, ended_at, "
    f"outcome, stale_writes) SELECT c.id, c.fencing_token, c.owner, %s, c.claimed_at, NULL, "
    f"'running', 0 FROM claimed c) "
)
# When the row was claimed, for the attempt's audit times. Not statement_timestamp(): that is
# when the statement *arrived*, and a claim that arrived while the owner still held the row
# (inside fenced()) and ran after its release committed would be stamped before the release
# ended the previous attempt. clock_timestamp() in RETURNING is read after the row lock and
# the re-check, so attempts of a task are stamped in the order they happened. Callers read
# the task columns by position; this trailing column is ignored by them.
_CLAIMED_AT = ", clock_timestamp() AS claimed_at"
_SELECT_WITH_PREVIOUS = (
    "SELECT c.*, (SELECT cl.owner FROM closed cl WHERE cl.task_id = c.id) FROM claimed c ORDER BY c.id"
)
_SELECT_PLAIN = "SELECT c.*, NULL FROM claimed c ORDER BY c.id"


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


class PostgreSQLBackend(Backend):
    vendor = "postgresql"
    # statement_timestamp(), not now(): now() is frozen at the start of the transaction.
    now = "statement_timestamp()"
    json_param = "%s::jsonb"
    needs_transaction = False

    def lease_sql(self) -> str:
        return "statement_timestamp() + make_interval(secs => %s)"

    def execute(self, cursor: Any, sql: str, params: list[Any]) -> None:
        # Django binds parameters on the client and never prepares (prepare_threshold=None, for
        # connection poolers), so PostgreSQL would parse and plan each claim again: planning
        # these fused CTE statements costs more than running them. The statements are few and
        # fixed, so each is PREPAREd once per server session and then run with EXECUTE.
        # TASKCLAIM_PREPARED_STATEMENTS = False turns this off (for transaction-mode poolers,
        # which hand each transaction to any server session: check E010).
        # With server-side binding (OPTIONS "server_side_binding") the statement runs as is:
        # PostgreSQL cannot type the parameters of an EXECUTE sent with the extended protocol
        # ("could not determine data type of parameter $1"), and psycopg prepares such queries
        # itself when OPTIONS "prepare_threshold" asks it to.
        db = getattr(cursor, "db", None)  # a Django CursorWrapper; plain DB-API cursors run as is
        if db is None or not settings.PREPARED_STATEMENTS or _binds_on_server(db):
            cursor.execute(sql, params)
            return
        entry = _STATEMENTS.get(sql)
        if entry is None:
            entry = _STATEMENTS[sql] = _prepared_form(sql)
        name, prepare_sql, execute_sql = entry
        self._prepare(db, name, prepare_sql)
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
            self._prepare(db, name, prepare_sql)
            cursor.execute(execute_sql, params)

    def _prepare(self, db: Any, name: str, prepare_sql: str) -> None:
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

    def columns(self, table: str = "") -> str:
        # jsonb as text: Django's psycopg setup loads jsonb as text anyway; be explicit.
        prefix = f"{table}." if table else ""
        return ", ".join(f'{prefix}"{c}"::text AS "{c}"' if c in ("payload", "result", "dispatch")
                         else f'{prefix}"{c}"' for c in TASK_COLUMNS)

    def returning(self, table: str = "") -> str:
        return self.columns(table) + _CLAIMED_AT

    def claim_key(
        self, cursor: Any, *, tenant: str, key: str, owner: str, lease: float, payload: str | None,
        fingerprint: str, max_attempts: int, delivery_id: str, audit: bool,
    ) -> tuple[Row | None, str | None]:
        params: list[Any] = [
            owner, lease, payload, fingerprint, tenant, key, fingerprint, fingerprint,  # update
            tenant, key, owner, max_attempts, lease, payload, fingerprint,  # insert
        ]
        if audit:
            sql = f"WITH {self.claim_key_sql()}{_OPEN_ATTEMPTS}{_SELECT_WITH_PREVIOUS}"
            params.append(delivery_id)
        else:
            sql = f"WITH {self.claim_key_sql()} {_SELECT_PLAIN}"
        self.execute(cursor, sql, params)
        row = cursor.fetchone()
        return (None, None) if row is None else (row[:-1], row[-1])

    def claim_key_sql(self) -> str:
        """CTEs ending in ``claimed``: take over an existing claimable row, or insert a new one.

        Not ``INSERT … ON CONFLICT DO UPDATE … WHERE``: that locks the conflicting row even when
        its WHERE is false, so the losers of a race on one key each held the row lock until their
        own commit (a WAL flush) and were decided one after another. An ``UPDATE`` whose WHERE
        fails on the row version it waited for (re-checked under READ COMMITTED) locks nothing,
        nor does ``ON CONFLICT DO NOTHING``: losers are decided together, without writing. A row
        committed after this statement's snapshot makes it claim nothing; ``claim()`` reads the
        row and tries again when it is claimable.
        """
        t, now = TASK, self.now
        return (
            f"upd AS (UPDATE {t} SET status = 'running', owner = %s, fencing_token = {t}.fencing_token + 1, "
            f"attempts = {t}.attempts + 1, lease_expires_at = {self.lease_sql()}, updated_at = {now}, "
            f"payload = CASE WHEN {t}.payload_fingerprint = '' THEN %s::jsonb ELSE {t}.payload END, "
            f"payload_fingerprint = CASE WHEN {t}.payload_fingerprint = '' THEN %s "
            f"ELSE {t}.payload_fingerprint END "
            f'WHERE {t}.tenant = %s AND {t}."key" = %s AND {claimable(t, now)} '
            f"AND (%s::text = '' OR {t}.payload_fingerprint IN ('', %s::text)) "
            f"RETURNING {self.returning(t)}), "
            f"ins AS (INSERT INTO {t} ({INSERT_COLUMNS}) SELECT %s::text, %s::text, 'running', %s::text, 1, 1, "
            f"%s::integer, {self.lease_sql()}, %s::jsonb, %s::text, NULL, '', '', NULL, {now}, {now} "
            f'WHERE NOT EXISTS (SELECT 1 FROM upd) ON CONFLICT (tenant, "key") DO NOTHING '
            f"RETURNING {self.returning()}), "
            f"claimed AS (SELECT * FROM upd UNION ALL SELECT * FROM ins)"
        )

    def claim_next(
        self, cursor: Any, *, owner: str, lease: float, tenant: str | None, limit: int,
        delivery_id: str, audit: bool,
    ) -> list[tuple[Row, str | None]]:
        now, t = self.now, TASK
        tenant_sql, tparams = ("AND tenant = %s", [tenant]) if tenant is not None else ("", [])
        # Two candidate lists, each served by its partial index; SKIP LOCKED so that workers
        # never queue behind each other. The UPDATE re-checks the claim predicate.
        sql = (
            f"WITH expired AS MATERIALIZED (SELECT id FROM {t} WHERE status = 'running' "
            f"AND lease_expires_at < {now} AND attempts < max_attempts {tenant_sql} "
            f"ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED), "
            f"pending AS MATERIALIZED (SELECT id FROM {t} WHERE status = 'pending' {tenant_sql} "
            f"ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED), "
            f"picked AS (SELECT id FROM (SELECT id FROM expired UNION ALL SELECT id FROM pending) u LIMIT %s), "
            f"claimed AS (UPDATE {t} SET status = 'running', owner = %s, "
            f"fencing_token = {t}.fencing_token + 1, attempts = {t}.attempts + 1, "
            f"lease_expires_at = {self.lease_sql()}, updated_at = {now} FROM picked p "
            f"WHERE {t}.id = p.id AND {claimable(t, now)} RETURNING {self.returning(t)})"
        )
        params: list[Any] = [*tparams, limit, *tparams, limit, limit, owner, lease]
        if audit:
            sql += _OPEN_ATTEMPTS + _SELECT_WITH_PREVIOUS
            params.append(delivery_id)
        else:
            sql += " " + _SELECT_PLAIN
        self.execute(cursor, sql, params)
        return [(row[:-1], row[-1]) for row in cursor.fetchall()]

    def read_state(
        self, cursor: Any, *, tenant: str, key: str, owner: str, fingerprint: str, delivery_id: str,
        audit: bool, in_transaction: bool,
    ) -> tuple[Row | None, bool, bool]:
        # One round trip for the loser of a race: read the state and record the duplicate
        # delivery together. Outside a caller's transaction, the duplicate's audit row is
        # committed asynchronously (set_config(..., is_local) lasts to this statement's commit):
        # it decides nothing, so losers need not wait for a WAL flush. A server crash may drop
        # the newest of these rows; claims, results and stale-write counts stay synchronous.
        now = self.now
        # The audit row's insert locks the task row (FOR KEY SHARE, as its foreign key check
        # would) in the same statement: a task deleted by a concurrent purge since this
        # statement's snapshot is skipped instead of failing the foreign key at commit, and a
        # purge that comes later waits for this row. Nothing inserted means the task vanished.
        dup_sql = (
            f", dup AS (INSERT INTO {ATTEMPT} (task_id, token, owner, delivery_id, started_at, ended_at, "
            f"outcome, stale_writes) SELECT t.id, NULL, %s, %s, {now}, {now}, 'duplicate', 0 FROM cur "
            f"JOIN {TASK} t ON t.id = cur.id "
            f"WHERE (cur.status = 'succeeded' OR (cur.status = 'running' AND NOT cur.expired)) "
            f"AND (%s::text = '' OR cur.payload_fingerprint IN ('', %s::text)) FOR KEY SHARE OF t RETURNING 1)"
        )
        async_sql = ", cfg AS (SELECT set_config('synchronous_commit', 'off', true))"
        params: list[Any] = [tenant, key]
        sql = (f'WITH cur AS (SELECT {self.columns()}, (lease_expires_at < {now}) AS expired FROM {TASK} '
               f'WHERE tenant = %s AND "key" = %s)')
        if audit:
            sql += dup_sql
            params += [owner, delivery_id, fingerprint, fingerprint]
            if not in_transaction:
                sql += async_sql
        sql += " SELECT cur.*, " + ("(SELECT count(*) FROM dup)" if audit else "0")
        sql += ", (SELECT count(*) FROM cfg)" if audit and not in_transaction else ", 0"
        sql += " FROM cur"
        self.execute(cursor, sql, params)
        found = cursor.fetchone()
        if found is None:
            return None, False, False
        row, expired = found[: len(TASK_COLUMNS)], bool(found[len(TASK_COLUMNS)])
        duplicate = is_duplicate(row, expired, fingerprint)
        if duplicate and audit and not found[len(TASK_COLUMNS) + 1]:
            return None, False, False  # purged since the snapshot: gone, as if never read
        return row, expired, duplicate

    def finish(
        self, cursor: Any, task_id: int, token: int, set_sql: str, set_params: list[Any],
        outcomes: tuple[str, str], audit: bool,
    ) -> str | None:
        if not audit:
            return super().finish(cursor, task_id, token, set_sql, set_params, outcomes, audit)
        self.execute(
            cursor,
            f"WITH t AS (UPDATE {TASK} SET {set_sql}, lease_expires_at = NULL, "
            f"updated_at = statement_timestamp() WHERE id = %s AND status = 'running' "
            f"AND fencing_token = %s RETURNING id, status), "
            f"a AS (UPDATE {ATTEMPT} SET outcome = CASE WHEN t.status = 'pending' THEN %s ELSE %s END, "
            f"ended_at = statement_timestamp() FROM t WHERE {ATTEMPT}.task_id = t.id AND {ATTEMPT}.token = %s) "
            f"SELECT status FROM t",
            [*set_params, task_id, token, *outcomes, token],
        )
        row = cursor.fetchone()
        return None if row is None else str(row[0])

    def lock(self, cursor: Any, task_id: int, token: int) -> bool:
        # A row lock, not a write: NO KEY UPDATE does not block the attempt table's FK checks.
        self.execute(
            cursor,
            f"SELECT 1 FROM {TASK} WHERE id = %s AND status = 'running' AND fencing_token = %s "
            f"FOR NO KEY UPDATE",
            [task_id, token],
        )
        return cursor.fetchone() is not None

    def reclaim(self, cursor: Any, limit: int | None, audit: bool) -> list[Row]:
        now, t = self.now, TASK
        limit_sql, params = ("LIMIT %s", [limit]) if limit is not None else ("", [])
        audit_sql = (
            f", closed AS (UPDATE {ATTEMPT} a SET outcome = 'expired', ended_at = {now} FROM moved m "
            f"WHERE a.task_id = m.id AND a.token = m.fencing_token AND a.outcome = 'running') "
            if audit else " "
        )
        cursor.execute(
            f"WITH victims AS (SELECT id FROM {t} WHERE status = 'running' AND lease_expires_at < {now} "
            f"ORDER BY id {limit_sql} FOR UPDATE SKIP LOCKED), "
            f"moved AS (UPDATE {t} SET {self.reclaim_set_sql(t)} FROM victims v WHERE {t}.id = v.id "
            f"AND {t}.status = 'running' AND {t}.lease_expires_at < {now} "
            f'RETURNING {t}.id, {t}."key", {t}.tenant, {t}.fencing_token, {t}.status)'
            f"{audit_sql}SELECT * FROM moved ORDER BY id",
            params,
        )
        return list(cursor.fetchall())


backend = PostgreSQLBackend()
