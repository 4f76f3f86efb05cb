"""MySQL 8 and MariaDB 10.6+: claims by conditional updates, row locks and ``SKIP LOCKED``.

Neither has ``UPDATE … RETURNING`` (MariaDB only returns from INSERT and DELETE), so a claim
is a conditional ``UPDATE`` whose row count tells whether it matched, then a read of the row
it now holds, inside one transaction: InnoDB's row lock keeps the row ours until the commit.
Django runs MySQL connections in READ COMMITTED, where a locking read or an update sees the
latest committed row, not the transaction's snapshot. The clock is ``UTC_TIMESTAMP(6)``
(fixed for the statement), compared with the naive UTC datetimes Django stores.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any

from django.core.checks import CheckMessage
from django.db import DatabaseError, IntegrityError, OperationalError, connections

from ..checkspec import spec
from ..status import Outcome, Status
from .rows import (
    ATTEMPT,
    TASK,
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
    EXHAUSTED_ERROR,
    SQLStore,
    chunks,
    fits,
    pairs_params,
)

MINIMUM_MYSQL = (8, 0, 1)  # FOR UPDATE SKIP LOCKED
MINIMUM_MARIADB = (10, 6)  # FOR UPDATE SKIP LOCKED
W021 = spec("django_taskclaim.W021", "MySQL database {alias!r} runs transactions at isolation level "
            "{level!r}.",
            "Remove OPTIONS['isolation_level'] (Django's default for MySQL is 'read committed') or set it "
            "to 'read committed': under 'repeatable read' a claim that lost a race can read an old "
            "snapshot of the task inside the caller's transaction, and InnoDB's gap locks make racing "
            "claims deadlock more often.")
E022 = spec("django_taskclaim.E022", "MySQL database {alias!r} connects with character set {charset!r}, "
            "which cannot carry every Unicode character.",
            "Set DATABASES[{alias!r}]['OPTIONS']['charset'] = 'utf8mb4' (Django before 5.2 connects with "
            "'utf8', MySQL's 3-byte utf8mb3): an owner, an error or a delivery id with an emoji or another "
            "4-byte character is refused in strict mode (error 1366: a failure that never lands, the task "
            "left running) and stored as '?' otherwise.")
E023 = spec("django_taskclaim.E023", "MySQL database {alias!r}: column(s) {columns} cannot store every "
            "Unicode character (character set {charsets}).",
            "Migration 0003_mysql_utf8mb4 converts every text column of the task tables to utf8mb4: "
            "migrate django_taskclaim to 0002 and forward again, or convert them yourself (ALTER TABLE … "
            "MODIFY … CHARACTER SET utf8mb4). Until then such text is refused in strict mode (error 1366) "
            "and stored as '?' otherwise, and a worker no longer recognises the claims of its own name.")
#: The migration that converts the task tables' text columns; E023 waits for it (migrate runs the checks).
UTF8MB4_MIGRATION = ("django_taskclaim", "0003_mysql_utf8mb4")
#: LIMIT's "all rows" on MySQL (it takes no NULL there; the documented way).
ALL_ROWS = 18446744073709551615
_DUPLICATE_KEY = 1062
_LOCK_WAIT_TIMEOUT = 1205
_DEADLOCK = 1213


def _code(exc: Exception) -> int | None:
    cause = exc.__cause__
    args = getattr(cause, "args", ())
    return args[0] if args and isinstance(args[0], int) else None




class MySQLStore(SQLStore):
    vendor = "mysql"
    naive_datetimes = "MySQL/MariaDB"
    now = "UTC_TIMESTAMP(6)"
    needs_transaction = True
    row_locks = True

    def lease_sql(self) -> str:
        return f"TIMESTAMPADD(MICROSECOND, %s, {self.now})"

    def lease_param(self, seconds: float) -> int:
        return round(seconds * 1_000_000)

    def unsupported(self, connection: Any) -> str | None:
        # The version comes from the server (one query per process, cached by Django). A server
        # that cannot be reached now is no reason to stop `manage.py check`: the first query says so.
        try:
            version, mariadb = tuple(connection.mysql_version), connection.mysql_is_mariadb
        except DatabaseError:
            return None
        if mariadb:
            if version < MINIMUM_MARIADB:
                return (f"MariaDB {'.'.join(map(str, version))} is too old: claims need MariaDB "
                        f"{'.'.join(map(str, MINIMUM_MARIADB))} or newer (FOR UPDATE SKIP LOCKED)")
        elif version < MINIMUM_MYSQL:
            return (f"MySQL {'.'.join(map(str, version))} is too old: claims need MySQL "
                    f"{'.'.join(map(str, MINIMUM_MYSQL))} or newer (FOR UPDATE SKIP LOCKED)")
        return None

    def system_check(self, alias: str, connection: Any) -> list[CheckMessage]:
        found = super().system_check(alias, connection)
        options: dict[str, Any] = connection.settings_dict.get("OPTIONS") or {}
        level = options.get("isolation_level", "read committed")
        if str(level or "").lower() != "read committed":
            found.append(W021.warning(alias=alias, level=level))
        # What the driver is asked for: OPTIONS over Django's default (utf8mb4 from Django 5.2).
        charset = connection.get_connection_params().get("charset", "")
        if str(charset).lower() != "utf8mb4":
            found.append(E022.error(alias=alias, charset=charset))
        return found

    def server_check(self, alias: str, connection: Any) -> list[CheckMessage]:
        return self._narrow_columns_check(alias, connection)

    def _narrow_columns_check(self, alias: str, connection: Any) -> list[CheckMessage]:
        """E023: text columns of the task tables that are not utf8mb4, once the migration that
        converts them has run (before it, ``migrate`` must not be stopped by this check)."""
        from django.db.migrations.recorder import MigrationRecorder

        if UTF8MB4_MIGRATION not in MigrationRecorder(connection).applied_migrations():
            return []
        with connection.cursor() as cursor:
            cursor.execute(self.sql("narrow_columns"), [TASK, ATTEMPT])
            narrow = cursor.fetchall()
        if not narrow:
            return []
        return [E023.error(alias=alias, columns=", ".join(f"{t}.{c}" for t, c, _ in narrow),
                           charsets=", ".join(sorted({cs for _, _, cs in narrow})))]

    def retryable(self, error: Exception) -> bool:
        return _code(error) == _DEADLOCK

    def limit_lock_waits(self, cursor: Any, seconds: float | None) -> None:
        if seconds is None:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = DEFAULT")
        else:  # whole seconds, at least 1: the variable's unit
            cursor.execute("SET SESSION innodb_lock_wait_timeout = %s", [max(1, round(seconds))])

    def _rows_by_id(self, cursor: Any, ids: Sequence[int]) -> list[TaskRow]:
        """The tasks ``ids``, in id order."""
        if not ids:
            return []
        cursor.execute(self.sql("rows_by_id", len(ids)), list(ids))
        return [self.decode(found) for found in cursor.fetchall()]

    def _claimed_rows(self, cursor: Any, ids: Sequence[int], audit: bool) -> list[tuple[TaskRow, Any]]:
        """Task rows this transaction just claimed, each with the owner of the attempt it took
        over when ``audit`` (read in the same statement: one round trip less per takeover)."""
        if not audit:
            return [(row, None) for row in self._rows_by_id(cursor, ids)]
        if not ids:
            return []
        cursor.execute(self.sql("claimed_rows_audited", len(ids)), list(ids))
        return [(self.decode(found), found[-1]) for found in cursor.fetchall()]

    def _inserted(self, cursor: Any, sql: str, params: list[Any]) -> int | None:
        """Run an insert of one task; its id, or ``None`` when ``(tenant, key)`` exists (a committed
        or concurrent insert: InnoDB makes the second wait for the first, then refuses it)."""
        try:
            cursor.execute(sql, params)
        except IntegrityError as exc:
            if _code(exc) != _DUPLICATE_KEY:
                raise
            return None  # MySQL undoes the failed statement only: the transaction goes on
        return int(cursor.lastrowid)

    # -- claims ---------------------------------------------------------------------------
    def claim_key(
        self, cursor: Any, *, tenant: str, key: str, owner: str, lease: float, payload: str | None,
        fingerprint: str, max_attempts: int, delivery_id: str, audit: bool, in_transaction: bool = False,
        exists: bool | None = None,
    ) -> Claimed | Found | None:
        previous = None
        # Take the existing row when it is claimable: a conditional UPDATE, re-checked by InnoDB
        # on the latest committed version of the row it locks. It waits for the row's holder,
        # hence only where a read just found a task it may claim (or read nothing).
        matched = False
        if exists is not False:
            params = [owner, self.lease_param(lease), payload, fingerprint, tenant, key, fingerprint, fingerprint]
            cursor.execute(self.sql("claim_existing"), params)
            matched = cursor.rowcount == 1
        if matched:
            # The row is ours (locked) until this transaction commits.
            cursor.execute(self.sql("claimed_by_key_audited" if audit else "read_task"), [tenant, key])
            found = cursor.fetchone()
            row, previous = self.decode(found), (found[-1] if audit else None)
        elif exists:
            return None  # taken by a racing claim meanwhile: the lifecycle reads it again
        else:
            new_id = self._inserted(cursor, self.sql("insert_claimed"),
                                    [tenant, key, owner, max_attempts, self.lease_param(lease), payload, fingerprint])
            if new_id is None:
                return None
            [row] = self._rows_by_id(cursor, [new_id])
        if audit:
            self._open_attempt(cursor, row, delivery_id, previous)
        return Claimed(row, previous)

    def record_duplicate(self, cursor: Any, task_id: int, owner: str, delivery_id: str) -> bool:
        """As the portable one; the audit row is left out where a transaction holds the task row
        for longer than :attr:`duplicate_record_wait` (MariaDB; MySQL, which has no ``WAIT n``: at
        once): its owner inside ``fenced()``, or a claim or an operator inside a caller's
        transaction. Claims, completions and operators otherwise hold it for a moment.

        The task row is share-locked first by the SELECT, then the attempt row is inserted: the
        order a purge takes them in (task rows FOR UPDATE, then their attempts); the foreign key
        check alone would lock the task row after the new attempt row, and deadlock with such a
        purge. Either lock waits for a transaction that holds the row exclusively.
        """
        if cursor.db.mysql_is_mariadb:
            wait = max(1, round(self.duplicate_record_wait))
            name, params = "record_duplicate_waiting", [owner, delivery_id, task_id, wait]
        else:  # MySQL has no WAIT n
            name, params = "record_duplicate", [owner, delivery_id, task_id]
        try:
            cursor.execute(self.sql(name), params)
        except OperationalError as exc:
            if _code(exc) != _LOCK_WAIT_TIMEOUT:
                raise
            return True  # still held (only this statement was undone): left out
        if cursor.rowcount == 1:
            return True
        # Skipped (MySQL: held), or deleted by a purge: a plain read tells which.
        cursor.execute(self.sql("task_exists"), [task_id])
        return cursor.fetchone() is not None

    def _open_attempt(self, cursor: Any, row: TaskRow, delivery_id: str, previous: str | None,
                      started: bool = True) -> None:
        """Record a claim; close the attempt it took over (``previous``: that attempt's owner). A
        reserved claim (not ``started``) opens no attempt of its own: :meth:`start` does."""
        if previous is not None:
            cursor.execute(self.sql("close_taken_over_attempt"), [row.id, row.fencing_token])
        if started:
            self.insert_attempt(cursor, row.id, row.fencing_token, row.owner, delivery_id)

    def unstart(self, cursor: Any, ids: Sequence[int], reserve: float) -> dict[int, datetime | None]:
        # No UPDATE … RETURNING: the rows are this transaction's (locked), read them back.
        cursor.execute(self.sql("unstart", len(ids)), [self.lease_param(reserve), *ids])
        cursor.execute(self.sql("read_leases", len(ids)), list(ids))
        return {r[0]: self.to_datetime(r[1]) for r in cursor.fetchall()}

    def start(self, cursor: Any, start: Start, audit: bool) -> datetime | None:
        cursor.execute(self.sql("start"), [self.lease_param(start.lease), start.task_id, start.token])
        if cursor.rowcount != 1:
            return None
        cursor.execute(self.sql("read_lease"), [start.task_id, start.token])
        expires = self.to_datetime(cursor.fetchone()[0])
        if audit:
            self.insert_attempt(cursor, start.task_id, start.token, start.owner, start.delivery_id)
        return expires

    def claim_next(
        self, cursor: Any, *, owner: str, lease: float, tenant: str | None, limit: int,
        delivery_id: str, audit: bool, queues: Sequence[str], path: str, exclude: int | None = None,
        reserve: float | None = None,
    ) -> tuple[list[Claimed], list[Moved]]:
        key, parts, params = self.queue_parts(queues, path, tenant, exclude)
        # Expired leases first (older work), then the due pending tasks, the highest priority
        # first; SKIP LOCKED so that workers never queue behind each other. Locked here,
        # updated below, in one transaction.
        cursor.execute(self.statement(("lock_expired_queued", *key),
                                      lambda: self.fill("lock_expired_queued", parts, len(queues))), [*params, limit])
        expired = cursor.fetchall()
        ids = [r[0] for r in expired if r[1]]
        exhausted = self._fail_exhausted(cursor, [r[0] for r in expired if not r[1]], audit)
        if len(ids) < limit:
            # A full key's tasks are passed over (has_room); of the others, those that fit (_within_limits).
            cursor.execute(self.statement(("lock_pending_queued", *key),
                                          lambda: self.fill("lock_pending_queued", parts, len(queues))),
                           [*params, limit - len(ids)])
            ids += self._within_limits(cursor, cursor.fetchall())
        if not ids:
            return [], exhausted
        cursor.execute(self.sql("claim_queued", len(ids)), [owner, self.lease_param(lease), *ids])
        found = [(row, previous) for row, previous in self._claimed_rows(cursor, ids, audit)
                 if row.status == Status.RUNNING and row.owner == owner]
        rows, reserved = self.reserve_rest(cursor, [row for row, _ in found], reserve)
        claimed = [Claimed(row, previous, row.id in reserved) for row, (_, previous) in zip(rows, found, strict=True)]
        if audit:
            for row, previous, is_reserved in claimed:
                self._open_attempt(cursor, row, delivery_id, previous, not is_reserved)
        return in_claim_order(claimed), exhausted

    def _within_limits(self, cursor: Any, pending: Sequence[Sequence[Any]]) -> list[int]:
        """Of the pending tasks a queue claim locked (``id, concurrency_key, concurrency_limit`` rows in
        claim order), those it may start: every unlimited one, and of each limited key those that fit
        (:func:`~django_taskclaim.store.sql.fits`).

        The selection counted in its snapshot; here each limited key's gate row is locked first (its
        version bumped: in key order, so two claims never deadlock on gates) and the key's running
        tasks counted again by a read after it, which sees every claim of the key committed before
        (READ COMMITTED, W021), while any claim of the key not yet committed holds the gate. So two
        claims never both take the key's last place."""
        limited = sorted({key for _, key, most in pending if key and most is not None})
        running: dict[str, int] = {}
        for key in limited:
            cursor.execute(self.sql("bump_gate"), [key])
        for key in limited:
            cursor.execute(self.sql("running_of_key"), [key])
            running[key] = int(cursor.fetchone()[0])
        kept: list[int] = []
        places: dict[str, int] = {}
        for pk, key, most in pending:
            if key and most is not None:
                places[key] = places.get(key, 0) + 1
                if not fits(running[key], places[key], most):
                    continue
            kept.append(pk)
        return kept

    def _fail_exhausted(self, cursor: Any, ids: Sequence[int], audit: bool) -> list[Moved]:
        """Expired tasks on their last attempt, locked by this transaction, to FAILED (as reclaim would)."""
        if not ids:
            return []
        cursor.execute(self.sql("fail_exhausted_locked", len(ids)), [EXHAUSTED_ERROR, *ids])
        moved = self._moved(cursor, ids)
        if audit:
            self.close_running_attempts(cursor, moved, Outcome.EXPIRED)
        return moved

    def ensure(
        self, cursor: Any, *, tenant: str, key: str, payload: str | None, fingerprint: str,
        max_attempts: int, dispatch: str | None, queue: str | None = None, priority: int = 0,
        run_after: datetime | None = None, task_path: str = "",
    ) -> TaskRow | None:
        new_id = self._inserted(cursor, self.sql("ensure"),
                                [tenant, key, max_attempts, payload, fingerprint, dispatch, queue, priority,
                                 self.datetime_param(cursor, run_after), task_path])
        if new_id is None:
            return None
        [row] = self._rows_by_id(cursor, [new_id])
        return row

    def ensure_many(self, cursor: Any, tasks: Sequence[NewTask]) -> list[TaskRow | None]:
        # No RETURNING (MySQL) and no ids to trust from a multi-row insert (interleaved auto-increment
        # locks): the rows inserted are read back by their keys.
        inserted: list[bool] = []
        for chunk in chunks(tasks, ENSURE_CHUNK):
            params = [value for task in chunk for value in self.new_task_params(cursor, task)]
            try:
                cursor.execute(self.sql("ensure_many", len(chunk)), params)
                inserted += [True] * len(chunk)
            except IntegrityError as exc:
                if _code(exc) != _DUPLICATE_KEY:
                    raise
                # A key exists (or comes twice): InnoDB undid this statement alone. One row at a time.
                inserted += [self._inserted(cursor, self.sql("ensure"), self.new_task_params(cursor, task)) is not None
                             for task in chunk]
        new = [(task.tenant, task.key) for task, made in zip(tasks, inserted, strict=True) if made]
        found = {(row.tenant, row.key): row for row in self.read_tasks(cursor, new)}
        return [found[(task.tenant, task.key)] if made else None for task, made in zip(tasks, inserted, strict=True)]

    # -- coalescing: the portable ``coalesce`` with MySQL's upsert and no RETURNING -------------
    def lock_group(self, cursor: Any, tenant: str, group: str) -> int | None:
        cursor.execute(self.sql("lock_group"), [tenant, group])
        cursor.execute(self.sql("locked_group"), [tenant, group])
        found = cursor.fetchone()
        return None if found[0] is None else int(found[0])

    def refresh_waiting(self, cursor: Any, task_id: int, *, task_path: str, payload: str | None, fingerprint: str,
                        delay: float, max_delay: float | None) -> TaskRow | None:
        cursor.execute(*self.refresh_waiting_call(task_id, task_path, payload, fingerprint, delay, max_delay))
        if cursor.rowcount != 1:
            return None
        [row] = self._rows_by_id(cursor, [task_id])
        return row

    def insert_waiting(self, cursor: Any, params: Sequence[Any]) -> TaskRow:
        new_id = self._inserted(cursor, self.sql("insert_waiting"), list(params))
        if new_id is None:  # 128 random bits met an existing key
            raise IntegrityError(f"coalesced task key {params[1]!r} exists already")
        [row] = self._rows_by_id(cursor, [new_id])
        return row

    # -- an owner's writes ----------------------------------------------------------------
    def heartbeat(self, cursor: Any, task_id: int, token: int, lease: float) -> datetime | None:
        cursor.execute(self.sql("heartbeat"), [self.lease_param(lease), task_id, token])
        if cursor.rowcount != 1:
            return None
        cursor.execute(self.sql("read_lease"), [task_id, token])
        found = cursor.fetchone()
        return None if found is None else self.to_datetime(found[0])

    def heartbeat_many(self, cursor: Any, held: Sequence[tuple[int, int]], lease: float) -> dict[int, datetime]:
        """No ``RETURNING``: the update, then a read of the pairs it renewed (by the primary key: the
        update locks only the rows it names), a chunk of 400 at most."""
        renewed: dict[int, datetime] = {}
        for chunk in chunks(held, 400):
            flat = pairs_params(chunk)
            cursor.execute(self.sql("heartbeat_many", len(chunk)), [self.lease_param(lease), *flat])
            if cursor.rowcount:
                cursor.execute(self.sql("leases_renewed", len(chunk)), flat)
                renewed.update((int(pk), expires) for pk, expires in self._expiries(cursor))
        return renewed

    def finish(
        self, cursor: Any, name: str, params: Sequence[Any], task_id: int, token: int, outcomes: tuple[str, str],
        audit: bool, known: str | None = None, *, attempt_params: Sequence[Any] = (), start: Start | None = None,
    ) -> str | None:
        """As the portable ``finish``; ``known``: the status the update sets, when it sets one
        status whatever the row held (a completion, a release), which spares reading it back."""
        cursor.execute(self.sql(name), [*params, task_id, token])
        if cursor.rowcount != 1:
            return None
        if known is not None:
            status = known
        else:
            # The row is ours until this transaction commits: read what the update made of it.
            cursor.execute(self.sql("status_of"), [task_id])
            status = str(cursor.fetchone()[0])
        if audit:
            self.close_attempt(cursor, task_id, token, outcomes[0] if status == Status.PENDING else outcomes[1],
                               attempt_params)
        self.carry_start(cursor, start, audit)
        return status

    # -- the sweeper and operators ---------------------------------------------------------
    def _moved(self, cursor: Any, ids: Sequence[int]) -> list[Moved]:
        return [Moved(r.id, r.key, r.tenant, r.fencing_token, r.status) for r in self._rows_by_id(cursor, ids)]

    def reclaim(self, cursor: Any, limit: int | None, audit: bool) -> list[Moved]:
        cursor.execute(self.sql("lock_expired"), [ALL_ROWS if limit is None else limit])
        ids = [r[0] for r in cursor.fetchall()]
        if not ids:
            return []
        cursor.execute(self.sql("reclaim", len(ids)), ids)
        moved = [m for m in self._moved(cursor, ids) if m.status in (Status.PENDING, Status.FAILED)]
        if audit:
            self.close_running_attempts(cursor, moved, Outcome.EXPIRED)
        return moved

    def purge(self, cursor: Any, *, statuses: Sequence[str], before: datetime, limit: int) -> tuple[int, int]:
        # Lock the victims through the unique (tenant, key) index, then their rows: the order a
        # claim by key takes them in (mysql.sql's purge_lock).
        cutoff = cursor.db.ops.adapt_datetimefield_value(before)
        cursor.execute(self.sql("purge_candidates", len(statuses)), [*statuses, cutoff, limit])
        found = cursor.fetchall()
        if not found:
            return 0, 0
        cursor.execute(self.sql("purge_lock", len(found)),  # locked, and checked again under the lock
                       [*(v for pair in found for v in pair), ",".join(statuses), cutoff])
        ids = sorted(r[0] for r in cursor.fetchall())
        if not ids:
            return 0, 0
        cursor.execute(self.sql("purge_attempts", len(ids)), ids)
        attempts = cursor.rowcount
        cursor.execute(self.sql("purge_steps", len(ids)), ids)
        cursor.execute(self.sql("purge_tasks", len(ids)), ids)
        return cursor.rowcount, attempts

    def _lock_rows(self, cursor: Any, sql: str, ids: Sequence[int]) -> list[int]:
        """Lock the tasks ``ids`` that ``sql`` (lock_cancellable, lock_resettable) picks, by primary
        key, in id order."""
        cursor.execute(sql, list(ids))
        return [r[0] for r in cursor.fetchall()]

    def cancel(self, cursor: Any, ids: Sequence[int], audit: bool) -> int:
        count = 0
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            locked = self._lock_rows(cursor, self.sql("lock_cancellable", len(chunk)), chunk)
            if not locked:
                continue
            cursor.execute(self.sql("cancel", len(locked)), locked)
            count += cursor.rowcount
            if audit:
                cursor.execute(self.sql("close_cancelled_attempts", len(locked)), locked)
        return count

    def reset(self, cursor: Any, ids: Sequence[int]) -> int:
        count = 0
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            locked = self._lock_rows(cursor, self.sql("lock_resettable", len(chunk)), chunk)
            if locked:
                cursor.execute(self.sql("reset", len(locked)), locked)
                count += cursor.rowcount
        return count

    def force_release(self, cursor: Any, held: Sequence[tuple[int, int]], audit: bool) -> list[Moved]:
        moved: list[Moved] = []
        for chunk in chunks(held, 400):
            cursor.execute(self.sql("lock_held", len(chunk)), [v for pair in chunk for v in pair])
            ids = [r[0] for r in cursor.fetchall()]
            if not ids:
                continue
            cursor.execute(self.sql("force_release", len(ids)), ids)
            tokens = dict(chunk)
            moved += [m._replace(token=tokens[m.id]) for m in self._moved(cursor, ids)]
        if audit:
            self.close_running_attempts(cursor, moved, Outcome.RELEASED)
        return moved

    def held(self, cursor: Any, ids: Sequence[int]) -> list[int]:
        if not ids:
            return []
        db = cursor.db
        if db.in_atomic_block or not db.get_autocommit():
            # InnoDB keeps the row locks taken after a savepoint when it is rolled back (once the
            # transaction holds any lock), so inside the caller's transaction the probe runs on
            # a connection of its own. Rows the caller's own transaction locked count as held there.
            probe = connections.create_connection(db.alias)
            try:
                with probe.cursor() as own:
                    return self._held(own, ids)
            finally:
                probe.close()
        return self._held(cursor, ids)

    def _held(self, cursor: Any, ids: Sequence[int]) -> list[int]:
        """In autocommit: the rows that exist, less those a locking read can take at once (locks
        that end with each statement)."""
        held: list[int] = []
        for start in range(0, len(ids), 500):
            chunk = list(ids[start:start + 500])
            cursor.execute(self.sql("existing_ids", len(chunk)), chunk)
            seen = {r[0] for r in cursor.fetchall()}
            cursor.execute(self.sql("free_ids", len(chunk)), chunk)
            held += sorted(seen - {r[0] for r in cursor.fetchall()})
        return held


    # -- fenced()'s other databases --------------------------------------------------------
    def read_only(self, db: Any, cursor: Any) -> AbstractContextManager[None] | str:
        if not db.get_autocommit():
            # SET TRANSACTION READ ONLY applies to the next transaction only, and a savepoint
            # restores no access mode: an open transaction stays writable.
            return "has a transaction open, which MySQL and MariaDB cannot make read-only once begun"
        return _read_only_transaction(db.connection)

    def refused_write(self, error: BaseException) -> bool:
        args: tuple[Any, ...] = getattr(error, "args", ())
        return bool(args) and args[0] == ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION


#: The error of a write refused in a read-only transaction (MySQL 8 and MariaDB).
ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION = 1792


@contextmanager
def _read_only_transaction(raw: Any) -> Iterator[None]:
    """One statement in autocommit mode, in a READ ONLY transaction of its own."""
    _run(raw, "START TRANSACTION READ ONLY")
    ended = False
    try:
        yield
        ended = True
        _run(raw, "COMMIT")
    finally:
        if not ended:
            _run(raw, "ROLLBACK")


def _run(raw: Any, sql: str) -> None:
    cursor = raw.cursor()
    try:
        cursor.execute(sql)
    finally:
        cursor.close()


store = MySQLStore()
