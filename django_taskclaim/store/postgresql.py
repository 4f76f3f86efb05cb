"""PostgreSQL: the hot paths fused into one statement each with data-modifying CTEs.

A claim (insert-or-take-over plus its audit rows), a completion (task plus attempt), a queue
claim (``FOR UPDATE SKIP LOCKED`` plus audit) and each operator action are one round trip.
The statements are in ``store/queries/postgresql.sql``, a statement per form (audited or not, a
reserved claim to start in the same commit…); the queue claim's 64 forms are one statement with
named slots, filled there from named parts (``queue_claim_parts`` names them).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any

from django.core.checks import CheckMessage
from django.db import transaction

from ..checkspec import spec
from ..conf import settings
from ..status import Status
from . import prepared
from .epochs import MAX_BUMPS_PER_TIMELINE
from .rows import (
    TASK_COLUMNS,
    Claimed,
    Found,
    Moved,
    NewTask,
    Start,
    TaskRow,
    in_claim_order,
)
from .sql import (
    ENSURE_CHUNK,
    SQLStore,
    chunks,
    is_duplicate,
)

E010 = spec("django_taskclaim.E010", "Database {alias!r} is set up for a transaction-mode connection pooler "
            "(DISABLE_SERVER_SIDE_CURSORS = True) and TASKCLAIM_PREPARED_STATEMENTS is on.",
            "Set TASKCLAIM_PREPARED_STATEMENTS = False. A pooler in transaction mode (PgBouncer's "
            "pool_mode = transaction, and the like) runs each transaction on any server session, where "
            "the statements django-taskclaim prepared in another session do not exist (PgBouncer "
            "1.21+ with max_prepared_statements may carry them: untested, see docs/configurations.md).")


#: Each ending's statement by (audited, a reserved claim to start in its commit): postgresql.sql.
ENDINGS = {
    "complete": {(False, False): "complete", (True, False): "complete_audited",
                 (False, True): "complete_then_start", (True, True): "complete_audited_then_start"},
    "fail": {(False, False): "fail", (True, False): "fail_audited",
             (False, True): "fail_then_start", (True, True): "fail_audited_then_start"},
    "release": {(False, False): "release", (True, False): "release_audited",
                (False, True): "release_then_start", (True, True): "release_audited_then_start"},
    "unreserve": {(False, False): "unreserve"},  # a reserved claim: no attempt row, nothing to start
}


#: The beginnings of PostgreSQL's warnings that a commit stopped waiting for its synchronous standby
#: (src/backend/replication/syncrep.c): a cancel, and a termination. The commit is done locally,
#: "but might not have been replicated to the standby". English messages (lc_messages).
SYNC_WAIT_CANCELLED = ("canceling wait for synchronous replication",
                       "canceling the wait for synchronous replication")


class _SyncWaits:
    """A psycopg connection's notice handler: whether a commit's wait for its synchronous standby
    was cancelled since the last :meth:`take`."""

    def __init__(self) -> None:
        self.cancelled = False

    def __call__(self, diagnostic: Any) -> None:
        if (diagnostic.message_primary or "").startswith(SYNC_WAIT_CANCELLED):
            self.cancelled = True

    def take(self) -> bool:
        cancelled, self.cancelled = self.cancelled, False
        return cancelled


_SYNC_WAITS: weakref.WeakKeyDictionary[Any, _SyncWaits] = weakref.WeakKeyDictionary()


def _sync_waits(db: Any) -> _SyncWaits | None:
    """The watcher of Django connection ``db``'s psycopg connection, added on first use."""
    raw = db.connection
    if raw is None:
        return None
    watcher = _SYNC_WAITS.get(raw)
    if watcher is None:
        watcher = _SYNC_WAITS[raw] = _SyncWaits()
        raw.add_notice_handler(watcher)
    return watcher


class PostgreSQLStore(SQLStore):
    vendor = "postgresql"
    # statement_timestamp(), not now(): now() is frozen at the start of the transaction.
    now = "statement_timestamp()"
    needs_transaction = False
    row_locks = True
    # Its claim statement never waits for an owner's fenced(): a row whose version in the
    # statement's snapshot fails the claim's WHERE is not locked, ON CONFLICT DO NOTHING locks
    # nothing, and the duplicate's FOR KEY SHARE does not conflict with fenced()'s FOR NO KEY UPDATE.
    looks_first = False
    # epoch_bump: the bumps one timeline takes (a new timeline starts again from 1).
    bump_limit = MAX_BUMPS_PER_TIMELINE

    def lease_sql(self) -> str:
        return "statement_timestamp() + make_interval(secs => %s)"

    def system_check(self, alias: str, connection: Any) -> list[CheckMessage]:
        """E010: prepared statements cannot live behind a transaction-mode pooler.

        Django asks for ``DISABLE_SERVER_SIDE_CURSORS = True`` exactly there (PgBouncer in
        transaction mode), so that setting is the sign; a session-mode pooler or Django's own
        pool keeps a session per connection, where prepared statements work.
        """
        found = super().system_check(alias, connection)
        if connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS") and settings.PREPARED_STATEMENTS:
            found.append(E010.error(alias=alias))
        return found

    def shifted_now(self, seconds: float) -> tuple[str, list[Any]]:
        return f"({self.lease_sql()})", [float(seconds)]

    def cursor(self, db: Any) -> Any:
        cursor = prepared.cursor(db)
        _sync_waits(db)  # so that a commit's cancelled wait for the standby is seen (commit_unconfirmed)
        return cursor

    def commit_unconfirmed(self, db: Any) -> bool:
        watcher = _sync_waits(db)
        return watcher.take() if watcher is not None else False

    def estimated_rows(self, cursor: Any, table: str) -> int | None:
        # pg_class.reltuples, kept by ANALYZE and autovacuum: -1 (or NULL) before the first.
        cursor.execute(self.sql("estimated_rows"), [table])
        row = cursor.fetchone()
        return None if row is None or row[0] is None or row[0] < 0 else int(row[0])

    def execute(self, cursor: Any, sql: str, params: Sequence[Any]) -> None:
        prepared.execute(cursor, sql, params)

    def limit_lock_waits(self, cursor: Any, seconds: float | None) -> None:
        # Transaction-local (is_local = true): behind PgBouncer in transaction mode, or in
        # Django's pool, a session-level setting would outlive us on another client's session.
        if seconds is not None:
            cursor.execute(self.sql("limit_lock_waits"), [f"{int(seconds * 1000)}ms"])

    #: Which claim statement a session sends first for a claim by key follows what its last
    #: claim met (postgresql.sql's claims by key; kept per session by ``prepared.claim_hint``): ``"insert"``
    #: after a claim that inserted a new task, ``"lean"`` after one that claimed an existing task,
    #: ``"reading"`` after one that met a task it could not claim. A hint only: every statement
    #: gives the same answers, at most one round trip later. A session's first claim sends this.
    first_claim = "lean"

    def claim_key(
        self, cursor: Any, *, tenant: str, key: str, owner: str, lease: float, payload: str | None,
        fingerprint: str, max_attempts: int, delivery_id: str, audit: bool, in_transaction: bool = False,
        exists: bool | None = None,
    ) -> Claimed | Found | None:
        inserting = [tenant, key, owner, max_attempts, lease, payload, fingerprint]
        if audit:
            inserting.append(delivery_id)
        known = kind = prepared.claim_hint(cursor, self.first_claim)
        if kind == "insert":
            self.execute(cursor, self.sql("claim_new" if audit else "claim_new_unaudited"), inserting)
            found = cursor.fetchone()
            if found is not None:
                return Claimed(self.decode(found), None)
            # The key exists (committed: the insert waited for a racing one): claim or read it.
            kind = "reading"
        params: list[Any] = [owner, lease, payload, fingerprint, tenant, key, fingerprint, fingerprint, *inserting]
        if kind == "reading":
            params += [tenant, key]  # the read when nothing was claimed
            if audit:
                params += [owner, delivery_id, fingerprint, fingerprint]
            # in_transaction changes only the statement that records a duplicate (its asynchronous commit).
            if not audit:
                name = "claim_key_or_duplicate_unaudited"
            else:
                name = "claim_key_or_duplicate_in_transaction" if in_transaction else "claim_key_or_duplicate"
        else:
            name = "claim_key" if audit else "claim_key_unaudited"
        self.execute(cursor, self.sql(name), params)
        found = cursor.fetchone()
        if found is None:
            self._learn(cursor, known, "reading")
            return None  # nothing claimed: the lifecycle reads the task (read_state) and decides
        row = self.decode(found)
        # After the task's columns: when it was claimed, whether its lease has expired, the owner
        # it was taken over from, whether it was claimed, whether a duplicate was recorded.
        _claimed_at, expired, previous, claimed, recorded = found[len(TASK_COLUMNS):]
        if claimed:
            # A new task: both stamps are the one statement's (a claim of an existing task moves
            # only updated_at).
            self._learn(cursor, known, "insert" if row.created_at == row.updated_at else "lean")
            return Claimed(row, previous)
        self._learn(cursor, known, "reading")
        expired, recorded = bool(expired), bool(recorded)
        if not is_duplicate(row, expired, fingerprint) or (audit and not recorded):
            # Not a duplicate as of this statement's snapshot (or the task vanished meanwhile):
            # the lifecycle reads the task afresh and decides.
            return None
        return Found(row, expired, True)

    @staticmethod
    def _learn(cursor: Any, known: str, hint: str) -> None:
        if hint != known:
            prepared.remember_claim(cursor, hint)

    def claim_next(
        self, cursor: Any, *, owner: str, lease: float, tenant: str | None, limit: int,
        delivery_id: str, audit: bool, queues: Sequence[str], path: str, reserve: float | None = None,
        exclude: int | None = None,
    ) -> tuple[list[Claimed], list[Moved]]:
        reserving = reserve is not None and limit > 1
        sql, params = self._queue_claim(owner=owner, lease=lease, tenant=tenant, limit=limit,
                                        delivery_id=delivery_id, audit=audit, queues=queues, path=path,
                                        exclude=exclude, reserve=reserve if reserving else None)
        self.execute(cursor, sql, params)
        return _claimed_and_exhausted(self, cursor.fetchall())

    def _queue_claim(
        self, *, owner: str, lease: float, tenant: str | None, limit: int, delivery_id: str, audit: bool,
        queues: Sequence[str], path: str, done: int | None = None, exclude: int | None = None,
        reserve: float | None = None,
    ) -> tuple[str, list[Any]]:
        """postgresql.sql's ``queue_claim`` in the form this call needs, and its parameters after the
        completion's: after completing task ``done`` in the same statement if given; task ``exclude``
        never picked. With ``reserve`` (seconds), only the first task to run is started; the others are
        reserved (their attempt not counted, no attempt row, a lease of ``reserve`` seconds)."""
        several = len(queues) > 1
        exclude = done if done is not None else exclude
        key = ("queue_claim", several, path, tenant is not None, done is not None, bool(exclude),
               reserve is not None, audit)
        sql = self.statement(key, lambda: self.fill("queue_claim", self.queue_claim_parts(
            several=several, path=path, tenant=tenant is not None, done=done is not None, exclude=bool(exclude),
            reserve=reserve is not None, audit=audit)))
        fparams: list[Any] = [list(queues) if several else queues[0], *([] if tenant is None else [tenant])]
        eparams = [*fparams, exclude] if exclude else fparams
        # Several queues: the same parameters, and one more limit (each queue's, then all of them).
        # The task a completion ends, for the limits' counts: in ``pending``, then in ``claimed``.
        counted = [] if done is None else [done]
        params: list[Any] = [*eparams, limit, *fparams, *counted, *([limit] if several else []), limit, limit, owner,
                             lease]
        if reserve is not None:
            params.append(reserve)
        params += counted
        if audit:
            params.append(delivery_id)
        return sql, params

    def queue_claim_parts(self, *, several: bool, path: str, tenant: bool, done: bool, exclude: bool,
                          reserve: bool, audit: bool) -> dict[str, str | None]:
        """The parts of postgresql.sql that fill ``queue_claim``'s slots in one of its forms (by name;
        ``None``: the slot stays empty)."""
        return {
            "completion": ("claim_done_audited" if audit else "claim_done") if done else None,
            "queues": "any_queue" if several else "one_queue",
            "pending": "pending_of_each_queue" if several else "pending_of_one_queue",
            "path": self.path_part(path),
            "tenant": "of_tenant" if tenant else None,
            "only_if_done": "after_done" if done else None,
            "exclude": "not_done" if exclude else None,
            "done_id": "completed_task" if done else "no_task",
            "first": "first_to_start" if reserve else None,
            "claim_set": "start_first_reserve_rest" if reserve else "start_claimed",
            "audit": "queue_claim_audit" if audit else None,
            "only_first": "of_first" if reserve else None,
            "results": "queue_claim_results_after_done" if done else "queue_claim_results",
            "previous": "taken_over_from" if audit else "no_owner",
            "flag": "first_started" if reserve else "started",
        }

    def start(self, cursor: Any, start: Start, audit: bool) -> datetime | None:
        # One statement: the start and its attempt row commit together (no transaction here).
        params: list[Any] = [start.lease, start.task_id, start.token]
        if audit:
            params += [start.owner, start.delivery_id]
        self.execute(cursor, self.sql("start_audited" if audit else "start"), params)
        row = cursor.fetchone()
        return None if row is None else self.to_datetime(row[0])

    def complete_and_claim_next(
        self, cursor: Any, task_id: int, token: int, result: str | None, result_ref: str, *, owner: str,
        lease: float, tenant: str | None, limit: int, delivery_id: str, audit: bool, queues: Sequence[str],
        path: str, reserve: float | None = None,
    ) -> tuple[str | None, list[Claimed], list[Moved]]:
        # One statement, one commit: the completion (fenced by its token), then the next claims,
        # made only if the completion matched (after_done). The candidates exclude the task being
        # completed: one statement may not update a row twice.
        params: list[Any] = [result, result_ref, task_id, token, *([task_id, token] if audit else [])]
        reserving = reserve is not None and limit > 1
        sql, more = self._queue_claim(owner=owner, lease=lease, tenant=tenant, limit=limit, delivery_id=delivery_id,
                                      audit=audit, queues=queues, path=path, done=task_id,
                                      reserve=reserve if reserving else None)
        self.execute(cursor, sql, params + more)
        found = cursor.fetchall()
        if not found or not found[0][-1]:
            return None, [], []
        claimed, exhausted = _claimed_and_exhausted(self, [f[:-1] for f in found if f[0] is not None])
        return str(Status.SUCCEEDED), claimed, exhausted

    def ensure_chunk(self, cursor: Any) -> int:
        return ENSURE_CHUNK

    def ensure_many_sql(self, cursor: Any, chunk: Sequence[NewTask]) -> tuple[str, list[Any]]:
        # One statement whatever the chunk's size: each column's values as one array.
        return self.sql("ensure_many"), [list(c) for c in zip(*chunk, strict=True)]

    def read_tasks(self, cursor: Any, keys: Sequence[tuple[str, str]]) -> list[TaskRow]:
        found: list[TaskRow] = []
        for chunk in chunks(keys, ENSURE_CHUNK):
            tenants, names = (list(column) for column in zip(*chunk, strict=True))
            self.execute(cursor, self.sql("read_tasks"), [tenants, names])
            found += (self.decode(r) for r in cursor.fetchall())
        return found

    def read_state(
        self, cursor: Any, *, tenant: str, key: str, owner: str, fingerprint: str, delivery_id: str,
        audit: bool, in_transaction: bool,
    ) -> Found | None:
        # One round trip for the loser of a race: read the state and record the duplicate
        # delivery together. Outside a caller's transaction, the duplicate's audit row is
        # committed asynchronously (set_config(..., is_local) lasts to this statement's commit):
        # it decides nothing, so losers need not wait for a WAL flush. A server crash may drop
        # the newest of these rows; claims, results and stale-write counts stay synchronous.
        params: list[Any] = [tenant, key]
        name = "read_state"
        if audit:
            params += [owner, delivery_id, fingerprint, fingerprint]
            name = "read_and_record_duplicate_in_transaction" if in_transaction else "read_and_record_duplicate"
        self.execute(cursor, self.sql(name), params)
        found = cursor.fetchone()
        if found is None:
            return None
        n = len(TASK_COLUMNS)
        row, expired, recorded = self.decode(found), bool(found[n]), bool(found[n + 1])
        duplicate = is_duplicate(row, expired, fingerprint)
        if duplicate and audit and not recorded:
            return None  # purged since the snapshot: gone, as if never read
        return Found(row, expired, duplicate)

    def finish(
        self, cursor: Any, name: str, params: Sequence[Any], task_id: int, token: int, outcomes: tuple[str, str],
        audit: bool, known: str | None = None, *, attempt_params: Sequence[Any] = (), start: Start | None = None,
    ) -> str | None:
        # One statement, one commit: the ending, its attempt row (by its unique (task_id, token) as
        # parameters: an index lookup), and a reserved claim to start if the ending matched.
        args: list[Any] = [*params, task_id, token]
        if audit:
            args += [*outcomes, *attempt_params, task_id, token]
        if start is not None:
            args += [start.lease, start.task_id, start.token]
            if audit:
                args += [start.owner, start.delivery_id]
        self.execute(cursor, self.sql(ENDINGS[name][audit, start is not None]), args)
        row = cursor.fetchone()
        if row is None:
            return None
        if start is not None:
            start.tried, start.expires = True, self.to_datetime(row[1])
        return str(row[0])

    def reclaim(self, cursor: Any, limit: int | None, audit: bool) -> list[Moved]:
        self.execute(cursor, self.sql("reclaim_audited" if audit else "reclaim"), [limit])  # LIMIT NULL: all
        return [Moved(*r) for r in cursor.fetchall()]

    def heartbeat_many(self, cursor: Any, held: Sequence[tuple[int, int]], lease: float) -> dict[int, datetime]:
        """One statement for any number of claims: the (id, token) pairs as two arrays, joined."""
        if not held:
            return {}
        cursor.execute(self.sql("heartbeat_many"),
                       [self.lease_param(lease), [pk for pk, _ in held], [token for _, token in held]])
        return {int(pk): expires for pk, expires in cursor.fetchall()}

    def force_release(self, cursor: Any, held: Sequence[tuple[int, int]], audit: bool) -> list[Moved]:
        if not held:
            return []
        cursor.execute(self.sql("force_release_audited" if audit else "force_release"),
                       [[pk for pk, _ in held], [token for _, token in held]])
        return [Moved(*r) for r in cursor.fetchall()]

    def cancel(self, cursor: Any, ids: Sequence[int], audit: bool) -> int:
        if not ids:
            return 0
        cursor.execute(self.sql("cancel_audited" if audit else "cancel"), [list(ids)])
        return int(cursor.fetchone()[0])

    def reset(self, cursor: Any, ids: Sequence[int]) -> int:
        cursor.execute(self.sql("reset"), [list(ids)])
        return int(cursor.rowcount)

    def held(self, cursor: Any, ids: Sequence[int]) -> list[int]:
        if not ids:
            return []
        # The rows this statement sees that SKIP LOCKED passes over. FOR SHARE conflicts with the
        # owner's FOR NO KEY UPDATE (fenced()) and with updates, not with a duplicate's FOR KEY
        # SHARE; locks of the caller's own transaction never conflict. Rolled back at once (a
        # savepoint inside the caller's transaction), so no lock outlives the probe.
        using = cursor.db.alias
        with transaction.atomic(using=using):
            cursor.execute(self.sql("held"), [list(ids), list(ids)])
            held = [r[0] for r in cursor.fetchall()]
            transaction.set_rollback(True, using=using)
        return held

    # -- fenced()'s other databases --------------------------------------------------------
    def read_only(self, db: Any, cursor: Any) -> AbstractContextManager[None] | str:
        # Transaction-scoped settings only: a session's SET would outlive the statement under
        # PgBouncer's transaction pooling (another client's transaction could inherit it, and our
        # next statement could run on a session without it).
        if db.get_autocommit():
            return _read_only_transaction(db.connection)
        if getattr(cursor, "name", None):
            return ("has a transaction open, and a server-side cursor (QuerySet.iterator()) declared in "
                    "it under the savepoint that makes it read-only would close with that savepoint")
        return _read_only_savepoint(db.connection)

    def refused_write(self, error: BaseException) -> bool:
        return getattr(error, "sqlstate", None) == READ_ONLY_SQL_TRANSACTION

    def report_settings(self, cursor: Any) -> None:
        cursor.execute(self.sql("report_settings"))


def _claimed_and_exhausted(store: PostgreSQLStore, found: Sequence[Sequence[Any]]) -> tuple[list[Claimed], list[Moved]]:
    claimed, exhausted = [], []
    for values in found:
        row = store.decode(values)
        if values[-1]:
            claimed.append(Claimed(row, values[-2], values[-1] == 2))
        else:
            exhausted.append(Moved(row.id, row.key, row.tenant, row.fencing_token, row.status))
    exhausted.sort(key=lambda m: m.id)
    return in_claim_order(claimed), exhausted


#: SQLSTATE of a write refused in a read-only transaction.
READ_ONLY_SQL_TRANSACTION = "25006"


@contextmanager
def _read_only_transaction(raw: Any) -> Iterator[None]:
    """One statement in autocommit mode, in a READ ONLY transaction of its own (committed after it,
    so that a cursor WITH HOLD, Django's ``iterator()`` in autocommit, stays open)."""
    with raw.cursor() as cursor:
        cursor.execute("BEGIN READ ONLY")
    ended = False
    try:
        yield
        with raw.cursor() as cursor:
            ended = True
            cursor.execute("COMMIT")
    finally:
        if not ended:
            with raw.cursor() as cursor:
                cursor.execute("ROLLBACK")


@contextmanager
def _read_only_savepoint(raw: Any) -> Iterator[None]:
    """One statement inside a transaction the block did not open (``ATOMIC_REQUESTS``, autocommit
    off): read-only under a savepoint (``SET LOCAL`` may only make a transaction read-only, never
    writable again), rolled back to afterwards, which restores the transaction's own access mode.
    The statement only read: rolling it back loses nothing but row locks it took."""
    with raw.cursor() as cursor:
        cursor.execute("SAVEPOINT taskclaim_read_only")
        cursor.execute("SET LOCAL transaction_read_only = on")
    try:
        yield
    finally:
        with raw.cursor() as cursor:
            cursor.execute("ROLLBACK TO SAVEPOINT taskclaim_read_only")
            cursor.execute("RELEASE SAVEPOINT taskclaim_read_only")


store = PostgreSQLStore()
