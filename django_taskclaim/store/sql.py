"""The portable store: standard SQL one statement at a time, with vendor differences as hooks.

SQLite uses it as it is (inside one write transaction opened by the lifecycle); other stores
override the clock, fuse statements (PostgreSQL) or replace what their dialect lacks (MySQL
has no ``UPDATE … RETURNING``). The statements are SQL files (``store/queries/``), asked for by
name (:meth:`SQLStore.sql`), or, for the queue claim's many forms, filled from named parts
(:meth:`SQLStore.fill`). Every value is a parameter.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast

from django.conf import settings
from django.core.checks import CheckMessage
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ..checkspec import spec
from ..status import Outcome, Status
from . import queries
from .epochs import MAX_EPOCH, EpochState
from .rows import (
    DATETIME_COLUMNS,
    JSON_COLUMNS,
    TASK_COLUMNS,
    Claimed,
    Found,
    Moved,
    NewTask,
    Start,
    StepRow,
    TaskRow,
    first_to_run,
    in_claim_order,
)

T = TypeVar("T")

_WIDTH = len(TASK_COLUMNS)
_JSON_AT = tuple(i for i, c in enumerate(TASK_COLUMNS) if c in JSON_COLUMNS)
_DATETIME_AT = tuple(i for i, c in enumerate(TASK_COLUMNS) if c in DATETIME_COLUMNS)


E002 = spec("django_taskclaim.E002", "Database {alias!r} cannot hold the task table: {problem}.",
            "Upgrade the database server (or the SQLite library) to a supported version; see "
            "docs/databases.md.")
E003 = spec("django_taskclaim.E003", "USE_TZ is False with {vendor}.",
            "Leases are compared with the database's UTC clock, and {vendor} stores datetimes without "
            "a time zone: set USE_TZ = True, so that Django stores them in UTC too.")


PENDING_STATUS = str(Status.PENDING.value)
EXHAUSTED_ERROR = "lease expired with no attempts left"


def fits(running: int, place: int, limit: int) -> bool:
    """Whether a pending candidate fits its key's limit: the key's running tasks plus its place
    (1, 2…) among the key's pending candidates of the claim, in claim order, within its own limit.
    The rule every store applies (in SQL on PostgreSQL and SQLite, here for MySQL)."""
    return running + place <= limit


def is_duplicate(row: TaskRow, expired: bool, fingerprint: str) -> bool:
    """A delivery that found the task held under a live lease, or done, with a compatible payload.

    (A different payload is a ``PayloadMismatch``, never a duplicate.)
    """
    live_or_done = row.status == Status.SUCCEEDED or (row.status == Status.RUNNING and not expired)
    # A queued task is other work than a claim by key, never a duplicate of one (it is refused).
    return row.queue is None and live_or_done and (not fingerprint or row.payload_fingerprint in ("", fingerprint))


def pairs_params(held: Sequence[tuple[int, int]]) -> list[int]:
    """The parameters of a list of claims written ``id IN (%s, ...) AND ((id = %s AND fencing_token
    = %s) OR ...)``: the ids, then each claim's id and token."""
    return [*(pk for pk, _ in held), *(v for pair in held for v in pair)]


#: Rows of one multi-row insert (``ensure_many``) at most, where the database's limit on parameters allows.
ENSURE_CHUNK = 1000


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in slices of ``size``."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


def max_params(cursor: Any) -> int | None:
    """How many parameters one statement may bind on ``cursor``'s database (``None``: no limit Django knows)."""
    limit = cursor.db.features.max_query_params
    return None if limit is None else int(limit)


class SQLStore:
    """Portable implementation of :class:`~django_taskclaim.store.protocol.Store`."""

    vendor = ""
    now = ""
    needs_transaction = True
    row_locks = False
    looks_first = True
    #: Seconds a duplicate delivery's audit row may wait for a transaction holding the task, where
    #: it would wait (SQLite's one write lock, MySQL's exclusive row lock), before it is left out:
    #: claims and completions hold it for a moment, an owner's fenced() block for as long as it
    #: runs, and the duplicate's answer must not wait for that.
    duplicate_record_wait = 1.0
    #: The database's name in check E003 when it stores datetimes without a time zone.
    naive_datetimes: str | None = None

    def __init__(self) -> None:
        self._statements: dict[tuple[Any, ...], str] = {}

    def sql(self, name: str, n: int | None = None) -> str:
        """The statement ``name`` as this vendor runs it: its own file's, else common.sql's
        (store/queries/), the parts it includes put in (once, at import); with ``n``, its list
        written ``item, ...`` repeated for ``n`` items (where the database has no arrays). Not kept
        per ``n``: the lists are as long as a call's ids (a purge's up to its limit), and repeating
        one is cheaper than sending it."""
        text = queries.INCLUDED[self.vendor][name]
        return text if n is None else queries.repeat(text, n)

    def fill(self, name: str, parts: Mapping[str, str | None], n: int | None = None) -> str:
        """The statement ``name`` with its ``{{slots}}`` filled by the named ``parts`` (:func:`queries.fill`),
        its list repeated for ``n`` items if given: a form of a statement with many, put together from
        the files only. Callers keep each form (:meth:`statement`): it is fixed once its parts are."""
        text = queries.fill(queries.STATEMENTS[self.vendor], name, parts)
        return text if n is None else queries.repeat(text, n)

    def path_part(self, path: str) -> str:
        """The part of a queue claim that says which tasks a worker takes: ``""`` work for a handler
        (no task path), ``"*"`` tasks that name the callable that runs them."""
        if path == "":
            return "handler_work"
        if path == "*":
            return "task_paths"
        raise ValueError(f"path must be '' or '*', not {path!r}")

    def statement(self, key: tuple[Any, ...], build: Callable[[], str]) -> str:
        """The SQL text ``build()`` makes for ``key``, put together once: a store's texts are fixed,
        and composing the fused statements again on every claim costs more client CPU than
        sending them."""
        try:
            return self._statements[key]
        except KeyError:
            sql = self._statements[key] = build()
            return sql

    # -- vendor hooks ---------------------------------------------------------------------
    def cursor(self, db: Any) -> Any:
        return db.cursor()

    def lease_sql(self) -> str:
        """SQL for ``db clock + %s seconds``; the parameter comes from :meth:`lease_param`."""
        raise NotImplementedError

    def lease_param(self, seconds: float) -> Any:
        return seconds

    def unsupported(self, connection: Any) -> str | None:
        """Why this server cannot hold the task table (too old…), or ``None``: check E002."""
        return None

    def system_check(self, alias: str, connection: Any) -> list[CheckMessage]:
        """E002 (a server :meth:`unsupported` refuses) and E003; stores add their own checks."""
        found: list[CheckMessage] = []
        if (problem := self.unsupported(connection)) is not None:
            found.append(E002.error(alias=alias, problem=problem))
        if self.naive_datetimes and not settings.USE_TZ:
            found.append(E003.error(vendor=self.naive_datetimes))
        return found

    def server_check(self, alias: str, connection: Any) -> list[CheckMessage]:
        return []

    def shifted_now(self, seconds: float) -> tuple[str, list[Any]]:
        return self.lease_sql(), [self.lease_param(seconds)]

    def estimated_rows(self, cursor: Any, table: str) -> int | None:
        """The database's own estimate of ``table``'s rows without counting them; ``None`` where it keeps none."""
        return None

    def datetime_param(self, cursor: Any, value: datetime | None) -> Any:
        """A datetime as this database's driver takes it for a column Django wrote (naive UTC text
        on SQLite and MySQL, as Django stores them)."""
        return None if value is None else cursor.db.ops.adapt_datetimefield_value(value)

    def begin_write(self, cursor: Any) -> None:
        """Nothing to do where row locks serialise writers; SQLite overrides it."""

    def join_callers_transaction(self, db: Any) -> None:
        """Only SQLite needs it (see there); the other drivers open one before any statement."""

    def limit_lock_waits(self, cursor: Any, seconds: float | None) -> None:
        raise NotImplementedError

    def retryable(self, error: Exception) -> bool:
        return False

    def execute(self, cursor: Any, sql: str, params: Sequence[Any]) -> None:
        """Run one of this app's statements; PostgreSQL runs the hot ones as prepared statements."""
        cursor.execute(sql, params)

    # -- conversion -----------------------------------------------------------------------
    def to_datetime(self, value: Any) -> datetime | None:
        if value is None or isinstance(value, datetime) and timezone.is_aware(value):
            return value
        parsed = value if isinstance(value, datetime) else parse_datetime(str(value))
        if parsed is not None and settings.USE_TZ and timezone.is_naive(parsed):
            parsed = timezone.make_aware(parsed, dt.UTC)
        return parsed

    def decode(self, values: Sequence[Any]) -> TaskRow:
        """A task row as selected (``TASK_COLUMNS`` first) into a :class:`TaskRow`."""
        decoded = list(values[:_WIDTH])
        for i in _JSON_AT:
            value = decoded[i]
            if isinstance(value, str | bytes):
                decoded[i] = json.loads(value)
        for i in _DATETIME_AT:
            value = decoded[i]
            # The common case first: the driver already gave an aware datetime (PostgreSQL).
            if value is not None and not (isinstance(value, datetime) and value.tzinfo is not None):
                decoded[i] = self.to_datetime(value)
        return TaskRow._make(decoded)

    # -- claims ---------------------------------------------------------------------------
    def claim_key(
        self, cursor: Any, *, tenant: str, key: str, owner: str, lease: float, payload: str | None,
        fingerprint: str, max_attempts: int, delivery_id: str, audit: bool, in_transaction: bool = False,
        exists: bool | None = None,
    ) -> Claimed | Found | None:
        sql = self.sql("claim_key")
        cursor.execute(sql, [tenant, key, owner, max_attempts, self.lease_param(lease), payload, fingerprint])
        found = cursor.fetchone()
        if found is None:
            return None
        row = self.decode(found)
        previous = self.open_attempt(cursor, row, delivery_id) if audit else None
        return Claimed(row, previous)

    def open_attempt(self, cursor: Any, row: TaskRow, delivery_id: str, started: bool = True) -> str | None:
        """Record a claim; close the attempt it took over, returning that attempt's owner. A
        reserved claim (not ``started``) opens no attempt of its own: :meth:`start` does."""
        cursor.execute(self.sql("take_over_attempt"), [row.id, row.fencing_token])
        previous = cursor.fetchone()
        if started:
            self.insert_attempt(cursor, row.id, row.fencing_token, row.owner, delivery_id)
        return previous[0] if previous else None

    def insert_attempt(self, cursor: Any, task_id: int, token: int, owner: str, delivery_id: str) -> None:
        """The attempt row of a claim that starts now."""
        cursor.execute(self.sql("insert_attempt"), [task_id, token, owner, delivery_id])

    def reserve_rest(self, cursor: Any, rows: list[TaskRow], reserve: float | None) -> tuple[list[TaskRow], set[int]]:
        """Of the rows one queue claim just took (inside its transaction), all but the first to run
        made reserved: their attempt not counted, their lease ``reserve`` seconds. The rows as they
        are now, and the ids reserved."""
        first = first_to_run(rows)
        if reserve is None or first is None or len(rows) < 2:
            return rows, set()
        rest = [r.id for r in rows if r.id != first.id]
        expires = self.unstart(cursor, rest, reserve)
        return [r if r.id == first.id else r._replace(attempts=r.attempts - 1, lease_expires_at=expires[r.id])
                for r in rows], set(rest)

    def unstart(self, cursor: Any, ids: Sequence[int], reserve: float) -> dict[int, datetime | None]:
        """Claims this transaction just made, not started after all: the attempt uncounted, the
        lease a reservation of ``reserve`` seconds; each one's new expiry."""
        cursor.execute(self.sql("unstart", len(ids)), [self.lease_param(reserve), *ids])
        return {r[0]: self.to_datetime(r[1]) for r in cursor.fetchall()}

    def read_state(
        self, cursor: Any, *, tenant: str, key: str, owner: str, fingerprint: str, delivery_id: str,
        audit: bool, in_transaction: bool,
    ) -> Found | None:
        self.execute(cursor, self.sql("read_state"), [tenant, key])
        found = cursor.fetchone()
        if found is None:
            return None
        row, expired = self.decode(found), bool(found[len(TASK_COLUMNS)])
        duplicate = is_duplicate(row, expired, fingerprint)
        if duplicate and audit and not self.record_duplicate(cursor, row.id, owner, delivery_id):
            return None  # purged between the read and the audit row
        return Found(row, expired, duplicate)

    def record_duplicate(self, cursor: Any, task_id: int, owner: str, delivery_id: str) -> bool:
        """Record a duplicate delivery; ``False`` when the task no longer exists (purged).

        One statement that inserts only while the task row exists: a purge that deleted the
        task since it was read makes this insert nothing instead of violating the foreign key.
        """
        self.execute(cursor, self.sql("record_duplicate"), [owner, delivery_id, task_id])
        return bool(cursor.rowcount == 1)

    def claim_next(
        self, cursor: Any, *, owner: str, lease: float, tenant: str | None, limit: int,
        delivery_id: str, audit: bool, queues: Sequence[str], path: str, reserve: float | None = None,
        exclude: int | None = None,
    ) -> tuple[list[Claimed], list[Moved]]:
        """The portable queue claim (SQLite's: sqlite.sql's ``queue_claim``); task ``exclude`` (the one a
        completion just ended) is never taken, expired or not."""
        key, parts, params = self.queue_parts(queues, path, tenant, exclude)
        exhausted = self.fail_exhausted_queued(cursor, key, parts, params, audit)
        cursor.execute(self.statement(("queue_claim", *key), lambda: self.fill("queue_claim", parts, len(queues))),
                       [owner, self.lease_param(lease), *params, limit])
        rows = sorted((self.decode(r) for r in cursor.fetchall()), key=lambda r: r.id)  # attempts in id order
        rows, reserved = self.reserve_rest(cursor, rows, reserve)
        claimed = [Claimed(row, self.open_attempt(cursor, row, delivery_id, row.id not in reserved) if audit else None,
                           row.id in reserved) for row in rows]
        return in_claim_order(claimed), exhausted

    def queue_parts(self, queues: Sequence[str], path: str, tenant: str | None,
                    exclude: int | None) -> tuple[tuple[Any, ...], dict[str, str | None], list[Any]]:
        """What fills common.sql's ``queue_filter`` for one call: the form's key, the parts named for its
        slots, and its parameters (the queue names, the tenant, the excluded task: those given)."""
        key = (len(queues), path, tenant is not None, exclude is not None)
        parts = {"path": self.path_part(path), "tenant": None if tenant is None else "of_tenant",
                 "exclude": None if exclude is None else "not_done"}
        return key, parts, [*queues, *([] if tenant is None else [tenant]), *([] if exclude is None else [exclude])]

    def fail_exhausted_queued(self, cursor: Any, key: tuple[Any, ...], parts: dict[str, str | None],
                              params: list[Any], audit: bool) -> list[Moved]:
        """Queued tasks (of the form ``key``, ``parts``: :meth:`queue_parts`) whose lease expired on their
        last attempt to FAILED, as ``reclaim`` would: a queue worker takes over what it can, and strands
        nothing it cannot."""
        cursor.execute(self.statement(("fail_exhausted_queued", *key),
                                      lambda: self.fill("fail_exhausted_queued", parts, key[0])), params)
        moved = sorted((Moved(*r) for r in cursor.fetchall()), key=lambda m: m.id)
        if audit:
            self.close_running_attempts(cursor, moved, Outcome.EXPIRED)
        return moved

    def complete_and_claim_next(
        self, cursor: Any, task_id: int, token: int, result: str | None, result_ref: str, *, owner: str,
        lease: float, tenant: str | None, limit: int, delivery_id: str, audit: bool, queues: Sequence[str],
        path: str, reserve: float | None = None,
    ) -> tuple[str | None, list[Claimed], list[Moved]]:
        # Inside the lifecycle's one transaction: one commit for both (SQLite and MySQL; PostgreSQL
        # fuses them into one statement).
        status = self.complete(cursor, task_id, token, result, result_ref, audit)
        if status is None:
            return None, [], []
        claimed, exhausted = self.claim_next(cursor, owner=owner, lease=lease, tenant=tenant, limit=limit,
                                             delivery_id=delivery_id, audit=audit, queues=queues, path=path,
                                             exclude=task_id, reserve=reserve)
        return status, claimed, exhausted

    def ensure(
        self, cursor: Any, *, tenant: str, key: str, payload: str | None, fingerprint: str,
        max_attempts: int, dispatch: str | None, queue: str | None = None, priority: int = 0,
        run_after: datetime | None = None, task_path: str = "",
    ) -> TaskRow | None:
        self.execute(
            cursor,
            self.sql("ensure"),
            [tenant, key, max_attempts, payload, fingerprint, dispatch, queue, priority,
             self.datetime_param(cursor, run_after), task_path],
        )
        found = cursor.fetchone()
        return None if found is None else self.decode(found)

    def set_limit(self, cursor: Any, task_id: int, concurrency_key: str, concurrency_limit: int) -> None:
        """Give the task ``task_id``, just inserted by this transaction, its concurrency limit."""
        self.execute(cursor, self.sql("set_limit"), [concurrency_key, concurrency_limit, task_id])

    def ensure_many(self, cursor: Any, tasks: Sequence[NewTask]) -> list[TaskRow | None]:
        rows: dict[tuple[str, str], TaskRow] = {}
        dispatches: dict[str | None, Any] = {}  # each dispatch text decoded once
        for chunk in chunks(tasks, self.ensure_chunk(cursor)):
            sql, params = self.ensure_many_sql(cursor, chunk)
            self.execute(cursor, sql, params)
            first: dict[tuple[str, str], NewTask] = {}
            for task in chunk:  # a key named twice: the first is inserted (in order), the others conflict
                first.setdefault((task.tenant, task.key), task)
            for found in cursor.fetchall():
                task = first[(found[1], found[2])]
                rows[(task.tenant, task.key)] = self.inserted_row(task, found, dispatches)
        # Each row once, to the first of the tasks that name its key: a later one met it existing.
        return [rows.pop((task.tenant, task.key), None) for task in tasks]

    def ensure_chunk(self, cursor: Any) -> int:
        """Tasks per multi-row insert: at most ``ENSURE_CHUNK``, fewer where the database's limit on a
        statement's parameters (one per value of every row) is lower."""
        width, limit = len(NewTask._fields), max_params(cursor)
        return ENSURE_CHUNK if limit is None else max(1, min(ENSURE_CHUNK, limit // width))

    def ensure_many_sql(self, cursor: Any, chunk: Sequence[NewTask]) -> tuple[str, list[Any]]:
        """The multi-row insert of ``chunk`` and its parameters: ``INSERT … VALUES (…), (…) …``, returning
        ``id, tenant, key, created_at, payload`` of the rows it inserted."""
        return (self.sql("ensure_many", len(chunk)),
                [value for task in chunk for value in self.new_task_params(cursor, task)])

    def inserted_row(self, task: NewTask, found: Sequence[Any], dispatches: dict[str | None, Any]) -> TaskRow:
        """The row a multi-row insert wrote for ``task``, from what it returned (``ensure_many``'s ``RETURNING``): the
        task's own values, and the database's id, time and stored payload (JSON as the database
        normalised it, as a read of the row gives it)."""
        pk, _, _, stamp, payload = found
        created = cast(datetime, self.to_datetime(stamp))  # NOT NULL
        if task.dispatch not in dispatches:
            dispatches[task.dispatch] = None if task.dispatch is None else json.loads(task.dispatch)
        return TaskRow(pk, task.tenant, task.key, PENDING_STATUS, "", 0, 0, task.max_attempts, None,
                       json.loads(payload) if isinstance(payload, str | bytes) else payload, task.payload_fingerprint,
                       None, "", "", dispatches[task.dispatch], created, created, task.queue, task.priority,
                       task.run_after, task.task_path)

    def new_task_params(self, cursor: Any, task: NewTask) -> list[Any]:
        """``ensure()``'s parameters of ``task``, in its statement's order."""
        return [*task[:8], self.datetime_param(cursor, task.run_after), task.task_path]

    def read_tasks(self, cursor: Any, keys: Sequence[tuple[str, str]]) -> list[TaskRow]:
        found: list[TaskRow] = []
        for chunk in chunks(keys, max(1, min(ENSURE_CHUNK, (max_params(cursor) or 2 * ENSURE_CHUNK) // 2))):
            self.execute(cursor, self.sql("read_tasks", len(chunk)), [value for pair in chunk for value in pair])
            found += (self.decode(r) for r in cursor.fetchall())
        return found

    # -- coalescing (``@coalesced`` Django tasks) ------------------------------------------------
    def coalesce(
        self, cursor: Any, *, tenant: str, group: str, key: str, payload: str | None, fingerprint: str,
        max_attempts: int, dispatch: str | None, queue: str, priority: int, task_path: str, delay: float,
        max_delay: float | None,
    ) -> tuple[TaskRow, bool]:
        """Inside a transaction: the group's waiting task with these arguments, or a new task.

        The group's row is locked first (created if absent) and stays locked until the commit, so
        enqueues of one group decide one after the other. Its latest task takes the arguments if it
        still waits (:meth:`refresh_waiting`: a conditional write, re-checked on the row it locks, so
        a claim that took the task first makes it match nothing); else a new task is inserted and
        becomes the group's latest. ``(row, created)``.
        """
        latest = self.lock_group(cursor, tenant, group)
        if latest is not None:
            row = self.refresh_waiting(cursor, latest, task_path=task_path, payload=payload,
                                       fingerprint=fingerprint, delay=delay, max_delay=max_delay)
            if row is not None:
                return row, False
        row = self.insert_waiting(cursor, (tenant, key, max_attempts, payload, fingerprint, dispatch, queue,
                                           priority, self.lease_param(delay), task_path))
        cursor.execute(self.sql("set_group_latest"), [row.id, tenant, group])
        return row, True

    def lock_group(self, cursor: Any, tenant: str, group: str) -> int | None:
        """Create the group's row unless it exists, lock it to the end of the transaction: its latest task's id."""
        self.execute(cursor, self.sql("lock_group"), [tenant, group])
        found = cursor.fetchone()
        return None if found[0] is None else int(found[0])

    def refresh_waiting_call(self, task_id: int, task_path: str, payload: str | None, fingerprint: str,
                             delay: float, max_delay: float | None) -> tuple[str, list[Any]]:
        """The collapse's statement and parameters: the newest arguments, "not before" now + delay,
        capped at the first enqueue (``created_at``) + ``max_delay`` where one is given."""
        params = [payload, fingerprint, self.lease_param(delay)]
        if max_delay is None:
            return self.sql("refresh_waiting"), [*params, task_id, task_path]
        return self.sql("refresh_waiting_capped"), [*params, self.lease_param(max_delay), task_id, task_path]

    def refresh_waiting(self, cursor: Any, task_id: int, *, task_path: str, payload: str | None, fingerprint: str,
                        delay: float, max_delay: float | None) -> TaskRow | None:
        """The task ``task_id`` with these arguments if it still waits (pending, never started:
        ``attempts = 0``, though a released claim raised its token); else ``None``."""
        self.execute(cursor, *self.refresh_waiting_call(task_id, task_path, payload, fingerprint, delay, max_delay))
        found = cursor.fetchone()
        return None if found is None else self.decode(found)

    def insert_waiting(self, cursor: Any, params: Sequence[Any]) -> TaskRow:
        """Insert a coalesced task (its key is new: 128 random bits); its row."""
        self.execute(cursor, self.sql("insert_waiting"), list(params))
        return self.decode(cursor.fetchone())

    def read_task(self, cursor: Any, *, tenant: str, key: str) -> TaskRow | None:
        self.execute(cursor, self.sql("read_task"), [tenant, key])
        found = cursor.fetchone()
        return None if found is None else self.decode(found)

    def adopt_payload(self, cursor: Any, task_id: int, payload: str | None, fingerprint: str) -> None:
        cursor.execute(self.sql("adopt_payload"), [payload, fingerprint, task_id])

    # -- an owner's writes ----------------------------------------------------------------
    def heartbeat(self, cursor: Any, task_id: int, token: int, lease: float) -> datetime | None:
        self.execute(cursor, self.sql("heartbeat"), [self.lease_param(lease), task_id, token])
        row = cursor.fetchone()
        return None if row is None else self.to_datetime(row[0])

    def heartbeat_many(self, cursor: Any, held: Sequence[tuple[int, int]], lease: float) -> dict[int, datetime]:
        """Renew the leases of many claims, each by its (id, token), in one statement (a chunk of 400
        at most): the ids renewed, with their new expiry. A pair missing was fenced off."""
        renewed: dict[int, datetime] = {}
        for chunk in chunks(held, 400):  # well under every database's parameter limit
            cursor.execute(self.sql("heartbeat_many", len(chunk)), [self.lease_param(lease), *pairs_params(chunk)])
            renewed.update((int(pk), expires) for pk, expires in self._expiries(cursor))
        return renewed

    def _expiries(self, cursor: Any) -> Iterator[tuple[Any, datetime]]:
        """The ``(id, lease_expires_at)`` rows a renewal read back (a renewed lease is never NULL)."""
        for pk, value in cursor.fetchall():
            expires = self.to_datetime(value)
            if expires is not None:
                yield pk, expires

    def start(self, cursor: Any, start: Start, audit: bool) -> datetime | None:
        """Start a reserved claim: its attempt counted, its attempt row opened, its lease the full
        one from now; the lease's expiry, or ``None`` when the claim no longer holds the task."""
        self.execute(cursor, self.sql("start"), [self.lease_param(start.lease), start.task_id, start.token])
        row = cursor.fetchone()
        if row is None:
            return None
        if audit:
            self.insert_attempt(cursor, start.task_id, start.token, start.owner, start.delivery_id)
        return self.to_datetime(row[0])

    def unreserve(self, cursor: Any, task_id: int, token: int) -> str | None:
        """Release a reserved claim (never started): PENDING, its attempt count unchanged."""
        return self.finish(cursor, "unreserve", [], task_id, token, (Outcome.RELEASED, Outcome.RELEASED), False,
                           Status.PENDING)

    def complete(
        self, cursor: Any, task_id: int, token: int, result: str | None, result_ref: str, audit: bool,
        start: Start | None = None,
    ) -> str | None:
        return self.finish(cursor, "complete", [result, result_ref], task_id, token,
                           (Outcome.SUCCEEDED, Outcome.SUCCEEDED), audit, Status.SUCCEEDED, start=start)

    def fail(
        self, cursor: Any, task_id: int, token: int, error: str, retry: bool, audit: bool, *,
        error_class: str = "", traceback: str = "", delay: float | None = None, start: Start | None = None,
    ) -> str | None:
        # A retried task may not run before the backoff (delay) is over; no delay: NULL.
        retry = bool(retry)
        later = None if delay is None else self.lease_param(delay)
        return self.finish(cursor, "fail", [retry, retry, error, retry, later], task_id, token,
                           (Outcome.RETRY, Outcome.FAILED), audit, attempt_params=[error, error_class, traceback],
                           start=start)

    def release(self, cursor: Any, task_id: int, token: int, audit: bool, start: Start | None = None,
                delay: float | None = None, reason: str | None = None) -> str | None:
        # Not claimed again before ``delay`` is over; ``reason`` kept in error for the operator who
        # wonders why the task waits. Either left as it was where NULL.
        later = None if delay is None else self.lease_param(delay)
        return self.finish(cursor, "release", [later, reason], task_id, token, (Outcome.RELEASED, Outcome.RELEASED),
                           audit, Status.PENDING, start=start)

    def finish(
        self, cursor: Any, name: str, params: Sequence[Any], task_id: int, token: int, outcomes: tuple[str, str],
        audit: bool, known: str | None = None, *, attempt_params: Sequence[Any] = (), start: Start | None = None,
    ) -> str | None:
        """Move a running task on by the statement ``name`` (its own ``params``, then the task's id
        and token: the guard); the new status, or ``None`` if fenced off.

        ``outcomes``: the attempt's outcome when the task went back to pending, and otherwise.
        ``known``: the status the statement always sets (for databases that cannot return it).
        ``attempt_params``: a failure's error, class and traceback, for its attempt row.
        ``start``: a reserved claim to start in the same transaction, if the ending matched.
        """
        self.execute(cursor, self.sql(name), [*params, task_id, token])
        row = cursor.fetchone()
        if row is None:
            return None
        if audit:
            self.close_attempt(cursor, task_id, token, outcomes[0] if row[0] == Status.PENDING else outcomes[1],
                               attempt_params)
        self.carry_start(cursor, start, audit)
        return str(row[0])

    def carry_start(self, cursor: Any, start: Start | None, audit: bool) -> None:
        """Start ``start``'s claim in the transaction of an ending that matched (see :class:`Start`)."""
        if start is not None:
            start.tried = True
            start.expires = self.start(cursor, start, audit)

    def close_attempt(self, cursor: Any, task_id: int, token: int, outcome: str,
                      attempt_params: Sequence[Any] = ()) -> None:
        """Close the attempt row of the claim (task id, token) with ``outcome``; a failure's with its
        error, class and traceback (``attempt_params``)."""
        if attempt_params:
            cursor.execute(self.sql("close_failed_attempt"), [outcome, *attempt_params, task_id, token])
        else:
            cursor.execute(self.sql("close_attempt"), [outcome, task_id, token])

    def lock(self, cursor: Any, task_id: int, token: int) -> bool:
        # SQLite: a no-op UPDATE as the transaction's first statement takes the one write lock
        # now; PostgreSQL and MySQL lock the row (their "lock" in store/queries/).
        self.execute(cursor, self.sql("lock"), [task_id, token])
        if self.row_locks:
            return cursor.fetchone() is not None
        return bool(cursor.rowcount == 1)

    def check(self, cursor: Any, task_id: int, token: int) -> bool:
        self.execute(cursor, self.sql("check"), [task_id, token])
        return cursor.fetchone() is not None

    def row_free(self, cursor: Any, task_id: int) -> int | None:
        # Where the database has row locks, its "row_free" skips a held row.
        cursor.execute(self.sql("row_free"), [task_id])
        row = cursor.fetchone()
        return None if row is None else int(row[0])

    def record_stale(self, cursor: Any, task_id: int, token: int) -> None:
        self.execute(cursor, self.sql("record_stale"), [task_id, token])

    def report_settings(self, cursor: Any) -> None:
        return None  # only PostgreSQL has settings worth changing for a report

    def set_progress(self, cursor: Any, task_id: int, token: int, fraction: float, note: str) -> bool:
        # Matched rows on MySQL too (Django connects with CLIENT.FOUND_ROWS): the same figure again counts.
        self.execute(cursor, self.sql("set_progress"), [fraction, note, token, task_id, token])
        return bool(cursor.rowcount == 1)

    # -- the sweeper and operators ---------------------------------------------------------
    def requeue(self, cursor: Any, task_id: int, dispatch: str, *, token: int | None,
                older_than: float | None) -> bool:
        if token is not None:
            cursor.execute(self.sql("requeue"), [dispatch, task_id, token])
        elif older_than is None:
            raise ValueError("requeue needs the token of a reclaimed task or an age (older_than)")
        else:
            cursor.execute(self.sql("requeue_stale"), [dispatch, task_id, self.lease_param(-older_than)])
        return bool(cursor.rowcount == 1)

    def reclaim(self, cursor: Any, limit: int | None, audit: bool) -> list[Moved]:
        cursor.execute(self.sql("reclaim"), [limit])
        moved = sorted((Moved(*r) for r in cursor.fetchall()), key=lambda m: m.id)
        if audit:
            self.close_running_attempts(cursor, moved, Outcome.EXPIRED)
        return moved

    def close_running_attempts(self, cursor: Any, moved: Sequence[Moved], outcome: str) -> None:
        if moved:
            cursor.executemany(self.sql("close_running_attempt"), [[outcome, m.id, m.token] for m in moved])

    def fail_exhausted(self, cursor: Any, task_id: int, token: int, audit: bool) -> bool:
        cursor.execute(self.sql("fail_exhausted"), [EXHAUSTED_ERROR, task_id, token])
        moved = cursor.rowcount == 1
        if moved and audit:
            cursor.execute(self.sql("close_expired_attempt"), [task_id, token])
        return moved

    def force_release(self, cursor: Any, held: Sequence[tuple[int, int]], audit: bool) -> list[Moved]:
        moved: list[Moved] = []
        for chunk in chunks(held, 400):  # well under every database's parameter limit
            cursor.execute(self.sql("force_release", len(chunk)), [v for pair in chunk for v in pair])
            moved += (Moved(*r) for r in cursor.fetchall())
        moved.sort(key=lambda m: m.id)
        if audit:
            self.close_running_attempts(cursor, moved, Outcome.RELEASED)
        return moved

    def cancel(self, cursor: Any, ids: Sequence[int], audit: bool) -> int:
        count = 0
        for start in range(0, len(ids), 500):
            chunk = list(ids[start:start + 500])
            cursor.execute(self.sql("cancel", len(chunk)), chunk)
            count += cursor.rowcount
            if audit:
                cursor.execute(self.sql("close_cancelled_attempts", len(chunk)), chunk)
        return count

    def reset(self, cursor: Any, ids: Sequence[int]) -> int:
        count = 0
        for start in range(0, len(ids), 500):
            chunk = list(ids[start:start + 500])
            cursor.execute(self.sql("reset", len(chunk)), chunk)
            count += cursor.rowcount
        return count

    def purge(self, cursor: Any, *, statuses: Sequence[str], before: datetime, limit: int) -> tuple[int, int]:
        # Row locks (FOR UPDATE, where there are any) make a concurrent reset wait, and a row
        # it already moved out of the finished states no longer matches once locked.
        cursor.execute(self.sql("purge_select", len(statuses)),
                       [*statuses, cursor.db.ops.adapt_datetimefield_value(before), limit])
        ids = [r[0] for r in cursor.fetchall()]
        if not ids:
            return 0, 0
        cursor.execute(self.sql("purge_attempts", len(ids)), ids)
        attempts = cursor.rowcount
        cursor.execute(self.sql("purge_steps", len(ids)), ids)
        cursor.execute(self.sql("purge_tasks", len(ids)), ids)
        return cursor.rowcount, attempts

    def held(self, cursor: Any, ids: Sequence[int]) -> list[int]:
        # SQLite locks the whole database, not rows: a writer inside fenced() makes others wait
        # (the busy timeout), and no row can be told apart as held.
        return []

    def commit_unconfirmed(self, db: Any) -> bool:
        return False  # no synchronous standby to wait for: a commit is confirmed when it returns

    # -- epochs (DESIGN §13; store/epochs.py) ----------------------------------------------------
    #: The limit epoch_bump's WHERE takes: the bumps below it may grow by one.
    bump_limit = MAX_EPOCH

    def read_epoch(self, cursor: Any) -> EpochState:
        cursor.execute(self.sql("epoch_read"))
        return EpochState(*(int(v) for v in cursor.fetchone()))

    def bump_epoch(self, cursor: Any) -> bool:
        cursor.execute(self.sql("epoch_row"))
        cursor.execute(self.sql("epoch_bump"), [self.bump_limit])
        return bool(cursor.rowcount == 1)

    # -- durable steps (claim.step) ----------------------------------------------------------
    def read_steps(self, cursor: Any, task_id: int, token: int) -> dict[str, StepRow] | None:
        self.execute(cursor, self.sql("read_steps"), [task_id, token])
        rows = cursor.fetchall()
        if not rows:
            return None  # fenced off
        return {name: StepRow(name, _json_text(result), int(stored_by)) for name, result, stored_by in rows
                if name is not None}

    def store_step(self, cursor: Any, task_id: int, token: int, name: str, result: str) -> bool:
        self.execute(cursor, self.sql("store_step"), [name, result, task_id, token])
        return bool(cursor.rowcount == 1)

    def read_step(self, cursor: Any, task_id: int, name: str) -> StepRow | None:
        cursor.execute(self.sql("read_step"), [task_id, name])
        row = cursor.fetchone()
        return None if row is None else StepRow(name, _json_text(row[0]), int(row[1]))


def _json_text(value: Any) -> str:
    """A JSON column's value as the JSON text stored (drivers hand it over as text or bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)
