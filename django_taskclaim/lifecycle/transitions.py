"""Every change of a task's state, owner and operator alike: one named operation each.

Each operation opens the scope its store needs (one write transaction on SQLite), runs the
store's guarded statement(s), and announces what changed (logs, and signals after commit).
Owner writes return ``None``/``False`` when the token no longer owns the task: the caller
(the :class:`~django_taskclaim.lifecycle.claim.Claim`) decides what a refusal means.
Callers pass intent (a token, a result, a lease), never SQL.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

from django.apps import apps
from django.db import InterfaceError, OperationalError, connections, transaction

from .. import signals
from ..conf import settings
from ..exceptions import CommitUnconfirmed, InvalidTaskKey, TaskClaimError
from ..ids import task_id
from ..status import Status
from ..store import get_store, store_of
from ..store.epochs import EpochState
from ..store.rows import Claimed, Found, Moved, NewTask, Start, StepRow, TaskRow

logger = logging.getLogger("django_taskclaim")

T = TypeVar("T")

DEADLOCK_ATTEMPTS = 5
DEADLOCK_BACKOFF = 0.01  # seconds: the first retry waits up to this long, each next one twice as long


class Holder(Protocol):
    """What a transition needs to know of a claim (``Claim`` is one)."""

    task_id: int
    key: str
    tenant: str
    token: int
    owner: str
    using: str


def task_model() -> Any:
    """The ``Task`` model, from Django's app registry: the lifecycle sits below the models,
    which call it, so it never imports them."""
    return apps.get_model("django_taskclaim", "Task")


def to_task(row: TaskRow, using: str) -> Any:
    """A store row as a ``Task`` instance loaded from ``using``."""
    return task_model().from_db(using, list(TaskRow._fields), list(row))


def cursor_for(using: str) -> Any:
    """A cursor on ``using`` for the store's statements (its own kind on PostgreSQL)."""
    return get_store(using).cursor(connections[using])


def in_transaction(using: str) -> bool:
    """Whether the connection is inside a transaction: an ``atomic()`` block, or autocommit off."""
    conn = connections[using]
    return bool(conn.in_atomic_block or not conn.get_autocommit())


def send(using: str, signal: Any, **kwargs: Any) -> None:
    """Send ``signal`` once the current transaction commits (at once outside one), with
    ``using``: the alias of the task database where the change happened."""
    if not signal.receivers:
        return
    sender = task_model()

    def deliver() -> None:
        for receiver, response in signal.send_robust(sender=sender, using=using, **kwargs):
            if isinstance(response, Exception):
                logger.error("signal receiver %r failed", receiver, exc_info=response)

    conn = connections[using]
    if not conn.in_atomic_block and not conn.get_autocommit():
        # Autocommit off with no atomic(): Django has no commit hook to wait for (on_commit
        # raises there), so receivers hear of the change now.
        deliver()
        return
    transaction.on_commit(deliver, using=using)


def _retried(using: str, operation: Callable[[], T], store: Any) -> T:
    """Run ``operation``, again when the database chose it as a deadlock's victim.

    InnoDB resolves a deadlock by rolling back one transaction (racing inserts of one key,
    a purge deleting a row that claims wait for). Only a transaction of our own is repeated:
    one of the caller's was rolled back as a whole, and the error is theirs to handle.
    """
    for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
        try:
            return operation()
        except OperationalError as exc:
            # Whose transaction it was is the same after the failure as before: an atomic block
            # of our own has ended, the caller's (or autocommit off) still holds.
            if attempt == DEADLOCK_ATTEMPTS or not store.retryable(exc) or in_transaction(using):
                raise
            logger.info("deadlock victim, trying again (%d)", attempt)
            # Inserts of one key queued behind a purge's delete of it wake together when the
            # purge commits, and deadlock with each other again if the victims return at once:
            # each waits a random moment first, up to twice as long after each failure.
            time.sleep(random.uniform(0, DEADLOCK_BACKOFF * 2 ** (attempt - 1)))  # noqa: S311 (jitter)
    raise AssertionError("unreachable")


def _write(using: str, operation: Callable[[Any], T], *, operator: bool = False) -> T:
    """Run ``operation(cursor)`` as one unit of work, repeated if chosen as a deadlock victim.

    Inside one transaction where the store needs it (SQLite, MySQL: several statements). An
    operator's change always gets one, whose first statement takes the write lock: on SQLite
    a transaction that read first fails at once with "database is locked" beside busy
    workers instead of waiting for the busy timeout.
    """
    db = connections[using]
    store = store_of(db)

    def once() -> T:
        if operator or store.needs_transaction:
            with transaction.atomic(using=using, savepoint=operator), store.cursor(db) as cursor:
                if operator:
                    store.begin_write(cursor)
                return operation(cursor)
        with store.cursor(db) as cursor:
            return operation(cursor)

    return _retried(using, once, store)


def _reconnecting(using: str, operation: Callable[[], T]) -> T:
    """Run ``operation``, once more on a new connection if the server dropped this one.

    A worker survives a dropped session (a restart, a failover, ``pg_terminate_backend``, an
    idle-session kill) instead of dying with the claim it holds: outside a transaction the
    statement simply runs again. Inside one, the transaction went with its connection, and the
    caller's rollback comes first.
    """
    try:
        return operation()
    except (OperationalError, InterfaceError):
        db = connections[using]
        if in_transaction(using):
            raise
        db.close_if_unusable_or_obsolete()
        if db.connection is not None:
            raise  # the connection works: the error was the statement's own
    logger.warning("database connection lost; running the statement again on a new one")
    return operation()


def _ending(holder: Holder, operation: Callable[[], T], status_of: Callable[[T], str | None],
            start: Start | None = None) -> T:
    """An owner's ending write (complete, fail, release), reconnecting if its session was dropped.

    A write whose session dropped may have committed before the client heard of it: the one
    sent again then matches nothing. Where the task is no longer running under this token
    since, the first write took effect, and its status is the answer (``status_of`` reads the
    status from the operation's return value). A ``start`` it carried is then unknown: it may
    have committed with the first write, so it is reported as taken (never started twice).
    """
    calls = 0

    def once() -> T:
        nonlocal calls
        calls += 1
        return operation()

    done = _reconnecting(holder.using, once)
    if calls > 1 and start is not None:
        start.tried, start.expires = True, None  # unknown: the worker lets the reserved claim go
    if calls == 1 or status_of(done) is not None:
        return done
    with cursor_for(holder.using) as cursor:
        row = get_store(holder.using).read_task(cursor, tenant=holder.tenant, key=holder.key)
    if row is not None and row.fencing_token == holder.token and row.status != Status.RUNNING:
        logger.info("the ending sent before the connection dropped had committed: %s", Named(holder),
                    extra=_log(holder))
        return _ended_as(done, str(row.status))
    return done


def _ended_as(done: Any, status: str) -> Any:
    """``done`` (a status, or ``(status, claims, exhausted)``) with ``status`` in place of ``None``."""
    return (status, [], []) if isinstance(done, tuple) else status


def _log(holder: Holder, **extra: Any) -> dict[str, Any]:
    """A log record's structured fields about a claim's task (``extra``)."""
    return {"key": holder.key, "tenant": holder.tenant, "token": holder.token, "owner": holder.owner,
            "task_id": task_id(holder.using, holder.task_id), "task_path": getattr(holder, "task_path", ""),
            **extra}


class Named:
    """A claim's task as a log message names it: the path of what runs it (queued work that names
    one), its id (a Django task's result id), key, tenant, token and owner. Formatted only when
    the line is emitted: ``logger.info("task released: %s", Named(claim))``."""

    # The values, not the claim: a log record keeps its arguments (a handler may hold it), and
    # must not keep a finished claim (its row, its payload) alive.
    __slots__ = ("key", "owner", "path", "pk", "tenant", "token", "using")

    def __init__(self, holder: Holder) -> None:
        self.path: str = getattr(holder, "task_path", "")
        self.using, self.pk, self.key = holder.using, holder.task_id, holder.key
        self.tenant, self.token, self.owner = holder.tenant, holder.token, holder.owner

    def __str__(self) -> str:
        return (f"{self.path + ' ' if self.path else ''}id={task_id(self.using, self.pk)} key={self.key!r} "
                f"tenant={self.tenant!r} token={self.token} owner={self.owner!r}")


# -- one key, one kind of work -------------------------------------------------------------
def work_of(queue: str | None, task_path: str) -> str:
    """The kind of work a task is, in words: claimed by key, or queued and what runs it."""
    if queue is None:
        return "a task claimed by key"
    return f"{task_path} (queue {queue!r})" if task_path else f"work for a handler (queue {queue!r})"


def refuse_other_work(row: TaskRow, *, queue: str | None, task_path: str = "") -> None:
    """``InvalidTaskKey`` unless the task found under a key is the kind of work the caller means.

    A key names one piece of work: a task claimed by key (``queue`` ``None``: ``claim()``,
    ``run_once``, the Celery bridge, LangGraph nodes), or a queued task with what runs it (its
    ``task_path``: a Django task, or ``""`` for a handler's work; the queue's name may differ).
    Whoever meets the other kind would run another body under its identity (and store that
    body's result as the task's), so it is refused, in both directions. The claim statements
    hold the same rule (``store.sql.claimable_by_key``): a claim by key never takes a queued task.
    """
    same = (row.queue is None) if queue is None else (row.queue is not None and row.task_path == task_path)
    if not same:
        raise InvalidTaskKey(f"key {row.key!r} (tenant {row.tenant!r}) already names other work: "
                             f"{work_of(row.queue, row.task_path)}, not {work_of(queue, task_path)}")


# -- claims --------------------------------------------------------------------------------
def claim_key(
    using: str, *, tenant: str, key: str, owner: str, lease: float, payload: str | None, fingerprint: str,
    max_attempts: int, delivery_id: str,
) -> Claimed | Found | None:
    """Claim (or take over) ``(tenant, key)``; else the task as found (``None``: it vanished)."""
    store, audit, inside = get_store(using), settings.AUDIT, in_transaction(using)

    def read_state() -> Found | None:
        with cursor_for(using) as cursor:
            return store.read_state(cursor, tenant=tenant, key=key, owner=owner, fingerprint=fingerprint,
                                    delivery_id=delivery_id, audit=audit, in_transaction=inside)

    # Where the claim's write would wait for the row's holder (an owner inside fenced()), the task
    # is read first: one it may not claim is answered from the read, without waiting. Not inside
    # a caller's transaction on a database without row locks (SQLite): the read's shared lock
    # cannot become the write lock while another connection writes ("database is locked" at
    # once, without the busy timeout), so there the write goes first and waits for its turn.
    looks_first = store.looks_first and not (inside and not store.row_locks)
    found = read_state() if looks_first else None
    if found is None or found.claimable(fingerprint):
        # None yet, one it may claim, or not read: the write may wait for a racing claim's transaction.
        exists = (found is not None) if looks_first else None
        if not inside:
            unconfirmed_commit(using)  # forget a warning from before: only the claim's own counts
        result = _write(using, lambda cursor: store.claim_key(
            cursor, tenant=tenant, key=key, owner=owner, lease=lease, payload=payload, fingerprint=fingerprint,
            max_attempts=max_attempts, delivery_id=delivery_id, audit=audit, in_transaction=inside, exists=exists))
        if isinstance(result, Claimed):
            if not inside and unconfirmed_commit(using):
                raise _unconfirmed(using, [result.row])
            return result
        found = result if result is not None else read_state()  # nothing claimed, nothing settled: read afresh
    if found is not None and found.duplicate:
        if logger.isEnabledFor(logging.INFO):
            row = found.row
            logger.info("duplicate delivery: %sid=%s key=%r tenant=%r (the task is %s, token %d) from owner %r",
                        row.task_path + " " if row.task_path else "", task_id(using, row.id), key, tenant,
                        row.status, row.fencing_token, owner,
                        extra={"key": key, "tenant": tenant, "token": row.fencing_token, "owner": owner})
        if signals.duplicate_delivery.receivers:  # spares building the Task when nobody listens
            send(using, signals.duplicate_delivery, task=to_task(found.row, using), owner=owner,
                 delivery_id=delivery_id)
    return found


def claim_next(
    using: str, *, owner: str, lease: float, tenant: str | None, limit: int, delivery_id: str,
    queues: Sequence[str], path: str, reserve: float | None = None,
) -> list[Claimed]:
    """Queue style: up to ``limit`` tasks of ``queues``, expired leases first, then the due
    pending ones by priority; expired tasks on their last attempt end FAILED on the way.

    Sent again on a new connection if the session was dropped: tasks a lost first statement
    may have claimed come back to the queue when their lease runs out.
    """
    store, inside = get_store(using), in_transaction(using)
    if not inside:
        unconfirmed_commit(using)  # forget a warning from before: only the claim's own counts
    claimed, exhausted = _reconnecting(using, lambda: _write(using, lambda cursor: store.claim_next(
        cursor, owner=owner, lease=lease, tenant=tenant, limit=limit, delivery_id=delivery_id,
        audit=settings.AUDIT, queues=queues, path=path, reserve=reserve)))
    _exhausted(using, exhausted)
    if claimed and not inside and unconfirmed_commit(using):
        raise _unconfirmed(using, [c.row for c in claimed])
    return claimed


def unconfirmed_commit(using: str) -> bool:
    """Whether a commit on ``using`` since the last call had its wait for the synchronous standby
    cancelled (PostgreSQL's warning): done on the primary, maybe lost in a failover. Clears it."""
    return get_store(using).commit_unconfirmed(connections[using])


def _unconfirmed(using: str, rows: Sequence[TaskRow]) -> CommitUnconfirmed:
    """The error of claims whose commit is not confirmed: never handed to a body (their tokens are
    the claims' own; the leases run out, or a failover forgets them)."""
    named = ", ".join(f"{row.key!r} (token {row.fencing_token})" for row in rows)
    logger.warning("claim of %s not confirmed: its commit's wait for the synchronous standby was cancelled",
                   named, extra={"tokens": [row.fencing_token for row in rows]})
    return CommitUnconfirmed(
        f"the claim of {named} in database {using!r} was committed on the primary, but its wait for the "
        "synchronous standby was cancelled: a failover may lose it, so it is not used")


def _exhausted(using: str, moved: Sequence[Moved]) -> None:
    """Tell logs and receivers of tasks a queue claim ended FAILED, as reclaim tells of them."""
    if moved:
        logger.info("%d expired task(s) on their last attempt ended FAILED", len(moved))
        send(using, signals.tasks_reclaimed, tasks=[(m.key, m.tenant, m.token, m.status) for m in moved])


def announce_claim(holder: Holder, previous_owner: str | None) -> None:
    """Tell logs and receivers of a claim (a takeover when ``previous_owner`` is set)."""
    takeover = previous_owner is not None
    if logger.isEnabledFor(logging.INFO):  # spares building the record's extras on every claim
        logger.info("task %s: %s%s", "taken over" if takeover else "claimed", Named(holder),
                    f" (from {previous_owner!r})" if takeover else "",
                    extra=_log(holder, previous_owner=previous_owner))
    send(holder.using, signals.task_claimed, claim=holder, takeover=takeover)
    if takeover:
        send(holder.using, signals.task_taken_over, claim=holder, previous_owner=previous_owner,
             previous_token=holder.token - 1)


def ensure(
    using: str, *, tenant: str, key: str, payload: str | None, fingerprint: str, max_attempts: int,
    dispatch: str | None, queue: str | None = None, priority: int = 0, run_after: datetime | None = None,
    task_path: str = "", concurrency: tuple[str, int] | None = None,
) -> tuple[TaskRow | None, bool]:
    """Create the task PENDING unless it exists; ``(row, created)``, row ``None`` if it vanished.
    ``concurrency``: a new task's ``(concurrency key, limit)``, written in its insert's transaction
    (a task met again keeps its own)."""
    store = get_store(using)

    def create(cursor: Any) -> TaskRow | None:
        made = store.ensure(cursor, tenant=tenant, key=key, payload=payload, fingerprint=fingerprint,
                            max_attempts=max_attempts, dispatch=dispatch, queue=queue, priority=priority,
                            run_after=run_after, task_path=task_path)
        if made is not None and concurrency is not None:
            store.set_limit(cursor, made.id, *concurrency)
        return made

    def limited() -> TaskRow | None:
        # The insert and its limit commit together: a claim never sees the task unlimited.
        with transaction.atomic(using=using), store.cursor(connections[using]) as cursor:
            return create(cursor)

    # Racing inserts of one key can deadlock on MySQL: _retried runs the insert again.
    row = _retried(using, (lambda: _plain(using, create)) if concurrency is None else limited, store)
    if row is not None:
        return row, True
    with cursor_for(using) as cursor:
        row = store.read_task(cursor, tenant=tenant, key=key)
        if row is not None:
            refuse_other_work(row, queue=queue, task_path=task_path)  # before its payload is stored
        if row is not None and fingerprint and not row.payload_fingerprint:
            # The encoded form (what the encoder made of Decimal, datetime...), as a claim stores it.
            store.adopt_payload(cursor, row.id, payload, fingerprint)
            row = store.read_task(cursor, tenant=tenant, key=key)
    return row, False


def insert(
    using: str, *, tenant: str, key: str, payload: str | None, fingerprint: str, max_attempts: int,
    dispatch: str | None, queue: str | None = None, priority: int = 0, run_after: datetime | None = None,
    task_path: str = "",
) -> TaskRow | None:
    """Create the task PENDING unless ``(tenant, key)`` exists: the new row, or ``None``. Unlike
    :func:`ensure`, an existing task is not read: one INSERT that does nothing on a conflict (what
    a schedule's tick costs each scheduler that finds it already fired)."""
    store = get_store(using)

    def create(cursor: Any) -> TaskRow | None:
        return store.ensure(cursor, tenant=tenant, key=key, payload=payload, fingerprint=fingerprint,
                            max_attempts=max_attempts, dispatch=dispatch, queue=queue, priority=priority,
                            run_after=run_after, task_path=task_path)

    # Racing inserts of one key can deadlock on MySQL: _retried runs the insert again.
    return _retried(using, lambda: _plain(using, create), store)


def ensure_many(using: str, tasks: Sequence[NewTask]) -> list[tuple[TaskRow, bool]]:
    """Create PENDING tasks unless they exist, in one transaction (a savepoint inside the caller's):
    for each task, in order, its row and whether this call created it. A task that existed is
    read as :func:`ensure` reads it (its payload stored if it had none)."""
    db = connections[using]
    store = store_of(db)

    def once() -> list[tuple[TaskRow, bool]]:
        with transaction.atomic(using=using), store.cursor(db) as cursor:
            made = store.ensure_many(cursor, tasks)
            met = [(task.tenant, task.key) for task, row in zip(tasks, made, strict=True) if row is None]
            found = {(row.tenant, row.key): row for row in store.read_tasks(cursor, met)} if met else {}
        out: list[tuple[TaskRow, bool]] = []
        for task, row in zip(tasks, made, strict=True):
            if row is not None:
                out.append((row, True))
                continue
            existing = found.get((task.tenant, task.key))
            if existing is not None:
                refuse_other_work(existing, queue=task.queue, task_path=task.task_path)
            if existing is None or (task.payload_fingerprint and not existing.payload_fingerprint):
                # Purged since the insert met it, or made without a payload: as ensure() does it.
                again, created = ensure(using, tenant=task.tenant, key=task.key, payload=task.payload,
                                        fingerprint=task.payload_fingerprint, max_attempts=task.max_attempts,
                                        dispatch=task.dispatch, queue=task.queue, priority=task.priority,
                                        run_after=task.run_after, task_path=task.task_path)
                if again is None:
                    raise TaskClaimError(f"task {task.key!r} (tenant {task.tenant!r}) kept vanishing under "
                                         "ensure_many(); try again")
                out.append((again, created))
            else:
                out.append((existing, False))
        return out

    # Racing inserts of one key can deadlock on MySQL: _retried runs it all again (outside a caller's transaction).
    return _retried(using, once, store)


def coalesce(
    using: str, *, tenant: str, group: str, key: str, payload: str | None, fingerprint: str, max_attempts: int,
    dispatch: str | None, queue: str, priority: int, task_path: str, delay: float, max_delay: float | None,
    concurrency: tuple[str, int] | None = None,
) -> tuple[TaskRow, bool]:
    """The group's waiting task with these arguments, or a new one: ``(row, created)``.

    One transaction (a savepoint inside the caller's, whose commit it then waits for) whose first
    statement takes the write lock on SQLite and the group's row lock elsewhere (``Store.coalesce``).
    ``concurrency``: the task's ``(concurrency key, limit)`` from these arguments, written in the
    same transaction, on a new task as on the waiting one that took them (a claim never sees it
    without them: the collapse holds the task's row until the commit).
    """
    store = get_store(using)

    def write(cursor: Any) -> tuple[TaskRow, bool]:
        row, created = store.coalesce(
            cursor, tenant=tenant, group=group, key=key, payload=payload, fingerprint=fingerprint,
            max_attempts=max_attempts, dispatch=dispatch, queue=queue, priority=priority, task_path=task_path,
            delay=delay, max_delay=max_delay)
        if concurrency is not None:
            store.set_limit(cursor, row.id, *concurrency)
        return row, created

    return _write(using, write, operator=True)


# -- an owner's writes -----------------------------------------------------------------------
def heartbeat(holder: Holder, lease: float) -> datetime | None:
    """Extend the lease from the database clock; ``None`` if fenced off."""
    return _reconnecting(holder.using, lambda: _plain(holder.using, lambda cursor: get_store(holder.using).heartbeat(
        cursor, holder.task_id, holder.token, lease)))


def heartbeat_many(using: str, held: Sequence[tuple[int, int]], lease: float) -> dict[int, datetime]:
    """Renew the leases of the ``(task id, token)`` pairs of ``held`` together (one statement on
    PostgreSQL and SQLite, two on MySQL): ``{task id: new expiry}`` of those renewed."""
    return _reconnecting(using, lambda: _plain(using, lambda cursor: get_store(using).heartbeat_many(
        cursor, held, lease)))


def _status(status: str | None) -> str | None:
    return status


def complete(holder: Holder, result: str | None, result_ref: str, start: Start | None = None) -> str | None:
    """RUNNING -> SUCCEEDED with the encoded result; ``None`` if fenced off. ``start``: a reserved
    claim started in the same commit (see :class:`~django_taskclaim.store.rows.Start`)."""
    store = get_store(holder.using)
    return _ending(holder, lambda: _write(holder.using, lambda cursor: store.complete(
        cursor, holder.task_id, holder.token, result, result_ref, settings.AUDIT, start=start)), _status, start)


def start(holder: Holder, lease: float) -> datetime | None:
    """Start the holder's reserved claim (its attempt counted from now, the full ``lease``): the new
    expiry, ``None`` if it was taken over meanwhile. Not sent again on a dropped connection: a
    start that committed unheard must not count a second attempt (the caller lets the claim go)."""
    store = get_store(holder.using)
    begun = Start(holder.task_id, holder.token, holder.owner, lease, getattr(holder, "delivery_id", ""))
    return _write(holder.using, lambda cursor: store.start(cursor, begun, settings.AUDIT))


def unreserve(holder: Holder) -> str | None:
    """A reserved claim (never started) back to PENDING, its attempt count unchanged; ``None`` if fenced off."""
    store = get_store(holder.using)
    return _ending(holder, lambda: _write(holder.using, lambda cursor: store.unreserve(
        cursor, holder.task_id, holder.token)), _status)


def complete_and_claim_next(
    holder: Holder, result: str | None, result_ref: str, *, owner: str, lease: float, tenant: str | None,
    limit: int, delivery_id: str, queues: Sequence[str], path: str, reserve: float | None = None,
) -> tuple[str | None, list[Claimed]]:
    """Complete the holder's task and claim the next ones in one commit; ``(None, [])`` if fenced off."""
    store = get_store(holder.using)
    def write(cursor: Any) -> tuple[str | None, list[Claimed], list[Moved]]:
        return store.complete_and_claim_next(
            cursor, holder.task_id, holder.token, result, result_ref, owner=owner, lease=lease, tenant=tenant,
            limit=limit, delivery_id=delivery_id, audit=settings.AUDIT, queues=queues, path=path, reserve=reserve)

    inside = in_transaction(holder.using)
    if not inside:
        unconfirmed_commit(holder.using)  # forget a warning from before: only this commit's counts
    status, claimed, exhausted = _ending(holder, lambda: _write(holder.using, write), lambda done: done[0])
    _exhausted(holder.using, exhausted)
    if claimed and not inside and unconfirmed_commit(holder.using):
        # The completion is done on the primary all the same; the next tasks' claims are not used
        # (logged), and come back when their leases run out.
        _unconfirmed(holder.using, [c.row for c in claimed])
        return status, []
    return status, claimed


def fail(
    holder: Holder, error: str, retry: bool, delay: float | None = None, error_class: str = "", traceback: str = "",
    start: Start | None = None,
) -> str | None:
    """RUNNING -> PENDING (retry, attempts left; not before ``delay`` seconds) or FAILED;
    ``None`` if fenced off."""
    store = get_store(holder.using)
    return _ending(holder, lambda: _write(holder.using, lambda cursor: store.fail(
        cursor, holder.task_id, holder.token, error, retry, settings.AUDIT, error_class=error_class,
        traceback=traceback, delay=delay, start=start)), _status, start)


def release(holder: Holder, start: Start | None = None, delay: float | None = None,
            reason: str | None = None) -> str | None:
    """RUNNING -> PENDING, the attempt not counted (not due before ``delay`` seconds, ``reason`` kept
    as the task's error); ``None`` if fenced off."""
    store = get_store(holder.using)
    return _ending(holder, lambda: _write(holder.using, lambda cursor: store.release(
        cursor, holder.task_id, holder.token, settings.AUDIT, start=start, delay=delay, reason=reason)),
        _status, start)


def check(holder: Holder) -> bool:
    """Whether the holder's token still owns the task."""
    return _reconnecting(holder.using, lambda: _plain(holder.using, lambda cursor: get_store(holder.using).check(
        cursor, holder.task_id, holder.token)))


def lock(holder: Holder) -> bool:
    """Inside the caller's transaction: lock the task row if the token still owns it."""
    with cursor_for(holder.using) as cursor:
        return get_store(holder.using).lock(cursor, holder.task_id, holder.token)


def refuse(holder: Holder, action: str) -> None:
    """Record a fenced-off write (audit count, log, signal); the caller raises ``StaleClaim``."""
    if settings.AUDIT:
        with cursor_for(holder.using) as cursor:
            get_store(holder.using).record_stale(cursor, holder.task_id, holder.token)
    logger.warning("fenced-off %s refused: %s", action, Named(holder), extra=_log(holder, action=action))
    send(holder.using, signals.stale_write_refused, key=holder.key, tenant=holder.tenant,
         token=holder.token, owner=holder.owner, action=action)


# -- the sweeper and operators -----------------------------------------------------------------
def reclaim(using: str, limit: int | None) -> list[Moved]:
    """Expired RUNNING tasks to PENDING (FAILED when attempts are spent)."""
    moved = _write(using, lambda cursor: get_store(using).reclaim(cursor, limit, settings.AUDIT))
    if moved:
        logger.info("reclaimed %d expired task(s)", len(moved))
        send(using, signals.tasks_reclaimed, tasks=[(m.key, m.tenant, m.token, m.status) for m in moved])
    return moved


def requeue(using: str, task_id: int, dispatch: str, *, token: int | None = None,
            older_than: float | None = None) -> bool:
    """A pending task's lost message is about to be sent again: record it (``dispatch``, JSON) if the
    task is still pending with ``token``, or unchanged for ``older_than`` seconds; whether it was."""
    store = get_store(using)
    return _write(using, lambda cursor: store.requeue(cursor, task_id, dispatch, token=token,
                                                      older_than=older_than))


def fail_exhausted(using: str, row: TaskRow) -> bool:
    """A task whose lease expired on its last attempt to FAILED, never claimed again."""
    store = get_store(using)
    moved = _write(using, lambda cursor: store.fail_exhausted(cursor, row.id, row.fencing_token, settings.AUDIT))
    if moved:
        send(using, signals.tasks_reclaimed, tasks=[(row.key, row.tenant, row.fencing_token, Status.FAILED.value)])
    return moved


def force_release(using: str, held: Sequence[tuple[int, int]]) -> list[Moved]:
    """RUNNING tasks ``(id, token)`` back to PENDING now, as their owner's release would."""
    store = get_store(using)
    moved = _write(using, lambda cursor: store.force_release(cursor, held, settings.AUDIT), operator=True)
    for m in moved:
        send(using, signals.task_released, claim=None, key=m.key, tenant=m.tenant)
    return moved


def cancel(using: str, ids: Sequence[int]) -> int:
    """Unfinished tasks to CANCELLED; a running owner is fenced off."""
    return _write(using, lambda cursor: get_store(using).cancel(cursor, ids, settings.AUDIT), operator=True)


def reset(using: str, ids: Sequence[int]) -> int:
    """FAILED or CANCELLED tasks back to PENDING with no attempts spent."""
    return _write(using, lambda cursor: get_store(using).reset(cursor, ids), operator=True)


def purge(using: str, *, statuses: Sequence[str], before: datetime, limit: int) -> tuple[int, int]:
    """Delete up to ``limit`` finished tasks last updated before ``before``; (tasks, attempts)."""
    store = get_store(using)
    return _write(using, lambda cursor: store.purge(cursor, statuses=statuses, before=before, limit=limit),
                  operator=True)


def read_epoch(using: str) -> EpochState:
    """The store's current epoch (DESIGN §13)."""
    return _plain(using, lambda cursor: get_store(using).read_epoch(cursor))


def bump_epoch(using: str) -> tuple[EpochState, EpochState]:
    """One more epoch (``taskclaim_epoch --bump``, for a failover tool's callback after a promotion):
    (before, after), read in the bump's transaction. ``TaskClaimError`` at the last epoch (nothing
    changed): store/epochs.py says where the edges are."""
    store = get_store(using)

    def bump(cursor: Any) -> tuple[EpochState, bool, EpochState]:
        before = store.read_epoch(cursor)
        bumped = store.bump_epoch(cursor)
        return before, bumped, store.read_epoch(cursor)

    before, bumped, after = _write(using, bump, operator=True)
    if not bumped:
        raise TaskClaimError(
            f"database {using!r} is at its last epoch ({before.epoch}; timeline {before.timeline}, "
            f"{before.bumps} bumps): a bump would wrap into tokens already handed out; nothing changed")
    return before, after


def _plain(using: str, operation: Callable[[Any], T]) -> T:
    """``operation(cursor)`` on a plain cursor: one statement, committed on its own (or the caller's)."""
    with cursor_for(using) as cursor:
        return operation(cursor)


def join_callers_transaction(using: str) -> None:
    """Autocommit off and no transaction open yet: open the caller's transaction now (SQLite)."""
    get_store(using).join_callers_transaction(connections[using])


# -- durable steps (lifecycle/steps.py) ------------------------------------------------------------
def read_steps(holder: Holder) -> dict[str, StepRow] | None:
    """The task's stored steps by name; ``None`` if the holder was fenced off."""
    return _reconnecting(holder.using, lambda: _plain(holder.using, lambda cursor: get_store(holder.using).read_steps(
        cursor, holder.task_id, holder.token)))


def store_step(holder: Holder, name: str, result: str) -> bool:
    """Store step ``name``'s result (JSON text), guarded by the holder's token: whether it was stored.
    Sent again on a new connection if the session was dropped: a first one that committed unheard
    makes the second store nothing, and the caller reads the step it stored."""
    return _reconnecting(holder.using, lambda: _plain(holder.using, lambda cursor: get_store(holder.using).store_step(
        cursor, holder.task_id, holder.token, name, result)))


def read_step(holder: Holder, name: str) -> StepRow | None:
    """One stored step of the holder's task."""
    return _plain(holder.using, lambda cursor: get_store(holder.using).read_step(cursor, holder.task_id, name))
