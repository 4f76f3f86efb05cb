"""The claim API: validate what the caller asks, run the transition, hand back claims and tasks.

``Task.objects.claim(...)`` and friends call these; so does the execution protocol's caller.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction

from .. import outages, routing
from ..conf import settings
from ..exceptions import InvalidArgument, PayloadMismatch, TaskClaimError
from ..identity import TaskKey, resolve_identity, validate_owner
from ..status import Status
from ..store.rows import Claimed, Moved, NewTask, TaskRow
from ..values import (
    DEFAULT_QUEUE,
    MAX_PATH_LENGTH,
    canonical_json,
    coalesce_seconds,
    concurrency_of,
    fingerprint_of,
    group_name,
    lease_seconds,
    payload_json,
    positive_int,
    queue_name,
    queue_names,
    valid_priority,
    valid_run_after,
    validate_text,
)
from . import transitions, visits
from .claim import Claim, claim_next_in
from .transitions import to_task

#: Rounds a claim or an ``ensure()`` by key tries before it reports a task that kept changing (or
#: vanishing) under it.
RACE_ROUNDS = 8


def _raced(round_: int) -> None:
    """Before round ``round_`` of a call by key: each round lost is another process's progress (a
    claim, a purge, an ``ensure()`` of the purged key); from the third on, a short random pause
    lets the racers part, so that a busy key is answered rather than reported as changing (four
    claimers and a purge loop on six keys lost three rounds in a row on a loaded MariaDB)."""
    if round_ >= 2:
        time.sleep(random.uniform(0, 0.002 * round_))  # noqa: S311 (jitter)


def default_owner() -> str:
    """A worker identity unique to this process and call: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class ClaimOutcome:
    """What a claim attempt found: ``claimed`` with a ``claim``, or the task's current state.

    ``task`` (a ``Task``) is built from the claimed row on first access: a worker that needs
    only the claim does not pay for a model instance on every claim.
    """

    __slots__ = ("_row", "_task", "_using", "claim", "claimed")

    def __init__(self, claimed: bool, claim: Claim | None, task: Any = None, *,
                 row: TaskRow | None = None, using: str = "") -> None:
        self.claimed = claimed
        self.claim = claim
        self._task, self._row, self._using = task, row, using

    @property
    def task(self) -> Any:
        if self._task is None and self._row is not None:
            self._task = to_task(self._row, self._using)
        return self._task

    def __repr__(self) -> str:
        return f"ClaimOutcome(claimed={self.claimed!r}, claim={self.claim!r}, task={self.task!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClaimOutcome):
            return NotImplemented
        return (self.claimed, self.claim, self.task) == (other.claimed, other.claim, other.task)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value, as the dataclass was


def _owner(owner: str | None) -> str:
    return validate_owner(owner) if owner else default_owner()


def _max_attempts(value: int | None) -> int:
    return settings.MAX_ATTEMPTS if value is None else positive_int(value, "max_attempts")


#: ``same_payload(stored, given)``: whether a stored payload is the same input as the one given,
#: though their JSON differs (a Django task's arguments, bound to its signature: ``tasks.identity``).
SamePayload = Callable[[Any, Any], bool]


def ensure(
    key: str | TaskKey, tenant: str = "", payload: Any = None, max_attempts: int | None = None, *,
    dispatch: dict[str, Any] | None = None, using: str | None = None, queue: str | None = None,
    priority: int = 0, run_after: datetime | None = None, task_path: str = "", concurrency_key: str = "",
    concurrency_limit: int | None = None,
) -> Any:
    """Create the task PENDING if ``(tenant, key)`` is absent; return it either way.

    A payload that differs from the stored one raises ``PayloadMismatch``; a payload given for
    a task created without one is stored. With ``queue`` the task is queued work, which
    ``claim_next(queue=...)`` hands out (the highest ``priority`` first, not before
    ``run_after``); without, it is claimed by key only. ``task_path`` names the callable that
    runs it (a Django task); ``""`` is work for a queue worker's handler. Queued work may have a
    ``concurrency_key`` and ``concurrency_limit``: ``claim_next()`` keeps at most that many tasks of
    the key running at once in the task's database (a task met again keeps its own).
    """
    return ensure_task(key, tenant, payload, max_attempts, dispatch=dispatch, using=using, queue=queue,
                       priority=priority, run_after=run_after, task_path=task_path,
                       concurrency_key=concurrency_key, concurrency_limit=concurrency_limit)[0]


def ensure_task(
    key: str | TaskKey, tenant: str = "", payload: Any = None, max_attempts: int | None = None, *,
    dispatch: dict[str, Any] | None = None, using: str | None = None, queue: str | None = None,
    priority: int = 0, run_after: datetime | None = None, task_path: str = "", same_payload: SamePayload | None = None,
    concurrency_key: str = "", concurrency_limit: int | None = None,
) -> tuple[Any, bool]:
    """:func:`ensure`, also telling whether this call created the task. ``same_payload`` decides whether
    a stored payload whose fingerprint differs is the same input after all (else ``PayloadMismatch``)."""
    key, tenant = resolve_identity(key, tenant)
    using = routing.route(tenant, using)
    stored = payload_json(payload)
    fp = fingerprint_of(stored)
    dispatch_json = None if dispatch is None else canonical_json(dispatch, "dispatch")
    limit = _max_attempts(max_attempts)
    if queue is None and (priority or run_after is not None or task_path):
        raise InvalidArgument("priority, run_after and task_path are for queued work: give a queue too")
    queue = None if queue is None else queue_name(queue)
    priority, run_after = valid_priority(priority), valid_run_after(run_after)
    task_path = validate_text(task_path, "task_path", MAX_PATH_LENGTH)
    concurrency = concurrency_of(concurrency_key, concurrency_limit, queued=queue is not None)
    # The row that made the insert conflict can be purged before it is read: insert again.
    for round_ in range(RACE_ROUNDS):
        _raced(round_)
        try:
            row, created = transitions.ensure(using, tenant=tenant, key=key, payload=stored, fingerprint=fp,
                                              max_attempts=limit, dispatch=dispatch_json, queue=queue,
                                              priority=priority, run_after=run_after, task_path=task_path,
                                              concurrency=concurrency)
        except routing.UNREACHABLE as exc:
            routing.unreachable(exc, using, tenant)
        if row is not None:
            break
    else:
        raise TaskClaimError(f"task {key!r} (tenant {tenant!r}) kept vanishing under ensure(); try again")
    if fp and row.payload_fingerprint != fp and not (same_payload and same_payload(row.payload, payload)):
        raise PayloadMismatch(key, tenant, row.payload_fingerprint, fp)
    return to_task(row, using), created


def insert_new(
    key: str | TaskKey, tenant: str = "", payload: Any = None, max_attempts: int | None = None, *,
    dispatch: dict[str, Any] | None = None, using: str | None = None, queue: str,
    priority: int = 0, run_after: datetime | None = None, task_path: str = "",
) -> Any:
    """Create the queued task PENDING unless ``(tenant, key)`` exists: the new ``Task``, or ``None``
    where the key was there already (whatever its payload: the existing task is not read).

    One statement where the key exists (an INSERT that does nothing on a conflict): how a
    schedule's tick is enqueued by any number of schedulers, once.
    """
    key, tenant = resolve_identity(key, tenant)
    using = routing.route(tenant, using)
    stored = payload_json(payload)
    dispatch_json = None if dispatch is None else canonical_json(dispatch, "dispatch")
    queue, priority, run_after = queue_name(queue), valid_priority(priority), valid_run_after(run_after)
    task_path = validate_text(task_path, "task_path", MAX_PATH_LENGTH)
    try:
        row = transitions.insert(using, tenant=tenant, key=key, payload=stored, fingerprint=fingerprint_of(stored),
                                 max_attempts=_max_attempts(max_attempts), dispatch=dispatch_json, queue=queue,
                                 priority=priority, run_after=run_after, task_path=task_path)
    except routing.UNREACHABLE as exc:
        routing.unreachable(exc, using, tenant)
    return None if row is None else to_task(row, using)


#: The longest ``delay``/``max_delay`` of a coalesced enqueue: 30 days.
MAX_COALESCE_DELAY = 30 * 86400.0


def coalesce_task(
    group: str, tenant: str = "", payload: Any = None, max_attempts: int | None = None, *, queue: str,
    task_path: str, priority: int = 0, delay: float | timedelta = 0, max_delay: float | timedelta | None = None,
    dispatch: dict[str, Any] | None = None, using: str | None = None, concurrency_key: str = "",
    concurrency_limit: int | None = None,
) -> tuple[Any, bool]:
    """Enqueue into a coalescing ``group``: its waiting task (enqueued, never started) now with
    ``payload`` and "not before" now + ``delay`` (but never past its first enqueue + ``max_delay``),
    else a new queued task, not before now + ``delay``, that becomes the group's waiting task.
    ``(task, created)``. Its key is ``coalesce:<group>:<32 random hex digits>``.
    ``concurrency_key``/``concurrency_limit``: as :func:`ensure_task`'s, written on the task either
    way (a group run one at a time: the follow-up waits while its predecessor runs).

    Atomic across processes (``transitions.coalesce``): of racing calls of one group, each either
    joins the one waiting task or, once it started, the one follow-up that the first of them made.
    """
    group = group_name(group)
    _, tenant = resolve_identity("-", tenant)
    key, _ = resolve_identity(f"coalesce:{group}:{secrets.token_hex(16)}", tenant)
    wait = coalesce_seconds(delay, "delay", MAX_COALESCE_DELAY)
    cap = None if max_delay is None else coalesce_seconds(max_delay, "max_delay", MAX_COALESCE_DELAY)
    if cap is not None and cap < wait:
        raise InvalidArgument(f"max_delay ({cap:g} s) is shorter than delay ({wait:g} s)")
    concurrency = concurrency_of(concurrency_key, concurrency_limit)
    using = routing.route(tenant, using)
    stored = payload_json(payload)
    try:
        row, created = transitions.coalesce(
            using, tenant=tenant, group=group, key=key, payload=stored, fingerprint=fingerprint_of(stored),
            max_attempts=_max_attempts(max_attempts), queue=queue_name(queue), priority=valid_priority(priority),
            task_path=validate_text(task_path, "task_path", MAX_PATH_LENGTH), delay=wait, max_delay=cap,
            dispatch=None if dispatch is None else canonical_json(dispatch, "dispatch"), concurrency=concurrency)
    except routing.UNREACHABLE as exc:
        routing.unreachable(exc, using, tenant)
    return to_task(row, using), created


def ensure_many(
    tasks: Iterable[tuple[str | TaskKey, str, Any]], max_attempts: int | None = None, *, queue: str,
    priority: int = 0, run_after: datetime | None = None, task_path: str = "", dispatch: dict[str, Any] | None = None,
    using: str | None = None, same_payload: SamePayload | None = None,
) -> list[tuple[TaskRow, bool, str]]:
    """:func:`ensure_task` for many queued tasks of one kind: for each ``(key, tenant, payload)`` of
    ``tasks``, in order, its row, whether this call created it, and the database alias it is in
    (its tenant's, so that the caller need not route it again).

    One multi-row insert per chunk of rows, all in one transaction (a savepoint inside the
    caller's): every task is created, or none. A key that exists (or came earlier in ``tasks``)
    is that task; a payload that differs from its stored one (and is not the same input by
    ``same_payload``, see :func:`ensure_task`) raises ``PayloadMismatch`` and nothing of the call
    is kept. Tasks of tenants routed to different databases raise ``TaskClaimError`` before
    anything is written (:func:`_one_database`).
    """
    limit = _max_attempts(max_attempts)
    queue, priority, run_after = queue_name(queue), valid_priority(priority), valid_run_after(run_after)
    task_path = validate_text(task_path, "task_path", MAX_PATH_LENGTH)
    dispatch_json = None if dispatch is None else canonical_json(dispatch, "dispatch")
    # Each task goes to its tenant's database (TASKCLAIM_ROUTER), the rows returned in the
    # order of ``tasks``.
    batches: dict[str, list[NewTask]] = {}
    for key, tenant, payload in tasks:
        key, tenant = resolve_identity(key, tenant)
        stored = payload_json(payload)
        batches.setdefault(routing.route(tenant, using), []).append(NewTask(
            tenant, key, limit, stored, fingerprint_of(stored), dispatch_json, queue, priority, run_after, task_path))
    if not batches:
        return []
    alias, batch = _one_database(batches)
    found: list[tuple[TaskRow, bool, str]] = []
    with transaction.atomic(using=alias):
        try:
            rows = transitions.ensure_many(alias, batch)
        except routing.UNREACHABLE as exc:
            routing.unreachable(exc, alias)
        for task, (row, created) in zip(batch, rows, strict=True):
            if (task.payload_fingerprint and row.payload_fingerprint != task.payload_fingerprint
                    and not (same_payload and same_payload(row.payload, json.loads(task.payload or "null")))):
                raise PayloadMismatch(task.key, task.tenant, row.payload_fingerprint, task.payload_fingerprint)
            found.append((row, created, alias))
    return found


def _one_database(batches: dict[str, list[NewTask]]) -> tuple[str, list[NewTask]]:
    """The one database of a bulk call's tasks, and its tasks; ``TaskClaimError`` when they span several.

    No transaction commits in two databases at once: PostgreSQL's two-phase commit needs
    ``max_prepared_transactions`` > 0 (0 by default) and a recovery manager for transactions
    left prepared, SQLite has none. With one transaction per database, a database that refuses
    its part at COMMIT (a deferred constraint, a serialization failure, a server gone) would
    leave the others' tasks committed, and workers would run them. So one call writes to one
    database, and the caller groups its calls by database.
    """
    if len(batches) == 1:
        [(alias, batch)] = batches.items()
        return alias, batch
    def tenants(batch: list[NewTask]) -> str:
        names = sorted({task.tenant for task in batch})
        return ", ".join(map(repr, names[:3])) + (", …" if len(names) > 3 else "")

    where = "; ".join(f"{len(batch)} in {alias!r} (tenants {tenants(batch)})" for alias, batch in batches.items())
    raise TaskClaimError(
        f"this bulk enqueue of {sum(map(len, batches.values()))} tasks spans task databases: {where}. One call "
        "commits in one database only: with a transaction in each, one database refusing its part at "
        "COMMIT would leave the others' tasks committed. Make one call per database (group the calls by "
        "ClaimBackend.database_for(tenant)), each all or nothing in its own database. Nothing was written.")


def claim(
    key: str | TaskKey, tenant: str = "", owner: str | None = None, lease: float | timedelta | None = None,
    payload: Any = None, *, max_attempts: int | None = None, delivery_id: str = "", using: str | None = None,
) -> ClaimOutcome:
    """Claim ``(tenant, key)``, creating the task if absent; take it over if its lease expired."""
    key, tenant = resolve_identity(key, tenant)
    seconds = lease_seconds(lease)
    owner = _owner(owner)
    validate_owner(delivery_id, "delivery_id")
    using = routing.route(tenant, using)
    stored = payload_json(payload)
    fp = fingerprint_of(stored)
    limit = _max_attempts(max_attempts)
    try:
        return _claim(using, key, tenant, owner, seconds, stored, fp, limit, delivery_id)
    except routing.UNREACHABLE as exc:
        routing.unreachable(exc, using, tenant)


def _claim(using: str, key: str, tenant: str, owner: str, seconds: float, stored: str | None, fp: str,
           limit: int, delivery_id: str) -> ClaimOutcome:
    # A claim can lose to a change that makes the task claimable again (a release) between the
    # statement and the read of the state; try again a few times before reporting what we saw.
    # A task deleted by taskclaim_purge meanwhile (even between the read and the duplicate's
    # audit row) reads as absent: the next round creates it afresh and claims it.
    for round_ in range(RACE_ROUNDS):
        _raced(round_)
        sent = time.monotonic()
        result = transitions.claim_key(using, tenant=tenant, key=key, owner=owner, lease=seconds,
                                       payload=stored, fingerprint=fp, max_attempts=limit,
                                       delivery_id=delivery_id)
        if result is None:
            continue  # purged between the statements: gone, so claim it afresh
        if isinstance(result, Claimed):
            claim_ = Claim.taken(result, using, seconds, delivery_id, sent=sent)
            return ClaimOutcome(True, claim_, row=result.row, using=using)
        row, expired = result.row, result.expired
        transitions.refuse_other_work(row, queue=None)  # a queued task: never claimed by key
        if fp and row.payload_fingerprint not in ("", fp):
            raise PayloadMismatch(key, tenant, row.payload_fingerprint, fp)
        running = row.status == Status.RUNNING
        if running and expired and row.attempts >= row.max_attempts:
            transitions.fail_exhausted(using, row)
            task = to_task(row, using)
            task.refresh_from_db(using=using)
            return ClaimOutcome(False, None, task)
        if row.status == Status.PENDING or (running and expired):
            continue
        return ClaimOutcome(False, None, row=row, using=using)
    raise TaskClaimError(f"task {key!r} (tenant {tenant!r}) kept changing under the claim; try again")


def claim_next(
    owner: str | None = None, lease: float | timedelta | None = None, tenant: str | None = None,
    limit: int = 1, *, queue: str | Sequence[str] = DEFAULT_QUEUE, path: str = "", delivery_id: str = "",
    using: str | None = None, reserve: bool = False,
) -> list[Claim]:
    """Claim up to ``limit`` queued tasks of ``queue`` (a name, or several): expired leases first,
    then the due pending ones, the highest priority first, then the oldest.

    Tasks claimed by key (``claim()``, ``run_once``, the Celery bridge, LangGraph nodes) are never
    handed out. ``path``: ``""`` takes work for a handler, ``"*"`` tasks that name the callable
    that runs them (Django tasks). An expired task on its last attempt ends FAILED on the way.

    ``reserve=True`` (a worker's batch): only the first claim to run is started; the others are
    reserved (``claim.reserved``) for a few seconds (``RESERVATION``) and count an attempt only when
    started (``claim.start()``, or ``claim.then_start(next)`` in the commit of the task before).
    A worker that dies charges only the task it had started; its reserved tasks come back soon,
    their attempt count unchanged.
    """
    seconds = lease_seconds(lease)
    positive_int(limit, "limit")
    if tenant is not None:
        _, tenant = resolve_identity("-", tenant)
    queues = queue_names(queue)
    if path not in ("", "*"):
        raise InvalidArgument(
            f"path must be '' (work for a handler) or '*' (tasks that name their callable), not {path!r}")
    owner = _owner(owner)
    validate_owner(delivery_id, "delivery_id")
    if tenant is not None:
        visit: Sequence[str] = (routing.route(tenant, using),)
    else:
        visit = routing.rotation(using)
    failed: BaseException | None = None
    for alias in visit:
        def call(alias: str = alias) -> list[Claim]:
            return claim_next_in(alias, owner=owner, lease=seconds, tenant=tenant, limit=limit,
                                 delivery_id=delivery_id, queues=queues, path=path, reserve=reserve)

        try:
            # One database, or the caller's own transaction (its claims are its own): on this thread.
            if len(visit) == 1 or _in_transaction(alias):
                claimed = call()
            else:  # one database hung must not hold up the others (lifecycle/visits.py)
                claimed = visits.visit(alias, call, settings.DATABASE_TIMEOUT)
        except routing.UNREACHABLE as exc:
            if len(visit) == 1:
                routing.unreachable(exc, alias, tenant)
            # One database out of reach must not stop the work of the others: the next one is
            # visited, and the error is raised when none had anything to hand out.
            outages.down(alias, exc)
            named = exc if getattr(exc, "taskclaim_alias", None) else routing.named(exc, alias)
            failed = failed or named or exc
            continue
        outages.up(alias)
        if claimed:
            return claimed
    if failed is not None:
        raise failed
    return []


def _in_transaction(alias: str) -> bool:
    """Whether this thread's connection to ``alias`` is in a transaction of the caller's (an atomic
    block, or autocommit turned off), which a claim must join."""
    connection = connections[alias]
    return connection.in_atomic_block or (connection.connection is not None and not connection.autocommit)


def reclaim_expired_rows(limit: int | None = None, *, using: str | None = None) -> list[Moved]:
    """Move expired RUNNING tasks to PENDING (FAILED when attempts are spent); the tasks moved.

    Of database ``using``, else of every task database in turn (``limit`` in all).
    """
    if limit is not None:
        positive_int(limit, "limit")
    moved: list[Moved] = []
    for alias in routing.databases(using):
        left = None if limit is None else limit - len(moved)
        if left == 0:
            break
        try:
            moved += transitions.reclaim(alias, left)
        except routing.UNREACHABLE as exc:
            routing.unreachable(exc, alias)
    return moved


def reclaim_expired(limit: int | None = None, *, using: str | None = None) -> int:
    """How many expired RUNNING tasks :func:`reclaim_expired_rows` moved."""
    return len(reclaim_expired_rows(limit, using=using))
