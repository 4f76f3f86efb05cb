"""Claims and every conditional state change of a task: the one place where leases move.

Each write by an owner is one guarded statement (``status = 'running' AND fencing_token = X``);
when it matches no row the owner was fenced off, :class:`StaleClaim` is raised, and nothing
was written. Lease arithmetic uses the database clock only.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, DataError, connections, transaction

from . import signals
from .aio import AsyncClaimMixin
from .backends import DbNow, get_backend
from .backends.base import TASK, Backend
from .conf import settings
from .exceptions import InvalidResult, PayloadMismatch, StaleClaim, TaskClaimError
from .keys import (
    MAX_OWNER_LENGTH,
    TaskKey,
    canonical_json,
    clean_text,
    fingerprint_of,
    lease_seconds,
    payload_json,
    positive_int,
    resolve_identity,
    to_json,
    validate_text,
)

if TYPE_CHECKING:
    from .models import Task

logger = logging.getLogger("django_taskclaim")

MAX_ERROR_LENGTH = 10_000
MAX_RESULT_REF_LENGTH = 1024


def default_owner() -> str:
    """A worker identity unique to this process and call: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _send(using: str, signal: Any, **kwargs: Any) -> None:
    """Send ``signal`` once the current transaction commits (at once outside one)."""
    if not signal.receivers:
        return
    from .models import Task

    def send() -> None:
        for receiver, response in signal.send_robust(sender=Task, **kwargs):
            if isinstance(response, Exception):
                logger.error("signal receiver %r failed", receiver, exc_info=response)

    conn = connections[using]
    if not conn.in_atomic_block and not conn.get_autocommit():
        # Autocommit off with no atomic(): Django has no commit hook to wait for (on_commit
        # raises there), so receivers hear of the change now.
        send()
        return
    transaction.on_commit(send, using=using)


def _write_scope(backend: Backend, using: str) -> AbstractContextManager[Any]:
    # SQLite runs multi-statement operations in one transaction (first statement a write).
    return transaction.atomic(using=using, savepoint=False) if backend.needs_transaction else nullcontext()


def in_transaction(using: str) -> bool:
    """Whether the connection is inside a transaction: an ``atomic()`` block, or autocommit off."""
    conn = connections[using]
    return bool(conn.in_atomic_block or not conn.get_autocommit())


def _owner(owner: str | None) -> str:
    return validate_text(owner, "owner", MAX_OWNER_LENGTH) if owner else default_owner()


def _error_text(error: object) -> str:
    """The text stored for a failure; never raises, whatever ``error`` holds or how it prints."""
    try:
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    except Exception:  # an exception whose __str__ fails must still be recorded
        text = f"{type(error).__name__}: <unprintable error>"
    return clean_text(text, MAX_ERROR_LENGTH)


class Claim(AsyncClaimMixin):
    """Proof that this worker owns a task until its lease expires: the token fences every write.

    Every method that writes has an awaitable twin (``acomplete``…, ``akeepalive``,
    ``afenced``) in :mod:`django_taskclaim.aio`.
    """

    def __init__(
        self, *, task_id: int, key: str, tenant: str, token: int, owner: str, lease: float,
        lease_expires_at: datetime | None, attempt: int, using: str, delivery_id: str = "",
    ) -> None:
        self.task_id = task_id
        self.key = key
        self.tenant = tenant
        self.token = token
        self.owner = owner
        self.lease = lease
        self.lease_expires_at = lease_expires_at
        self.attempt = attempt
        self.using = using
        self.delivery_id = delivery_id
        # Set by keepalive() when a heartbeat is refused or the lease ran out locally.
        self.lost = threading.Event()
        self.lost_reason: BaseException | None = None
        # complete/fail/release under way or done: a refused heartbeat then means nothing was lost.
        self._finishing = False
        # This thread's open transaction holds the task row (fenced(), a heartbeat inside it):
        # nobody can take over until it ends, and a heartbeat from another connection would wait.
        # (Consulted on SQLite only; PostgreSQL asks the row's lock itself.)
        self._row_held = False

    def __repr__(self) -> str:
        return f"<Claim {self.key!r} tenant={self.tenant!r} token={self.token} owner={self.owner!r}>"

    @property
    def _backend(self) -> Backend:
        return get_backend(self.using)

    def _log_extra(self) -> dict[str, Any]:
        return {"key": self.key, "tenant": self.tenant, "token": self.token, "owner": self.owner}

    def _refuse(self, action: str) -> None:
        """Count the fenced-off write in the audit trail, tell receivers, raise ``StaleClaim``."""
        if settings.AUDIT:
            with connections[self.using].cursor() as cursor:
                self._backend.record_stale(cursor, self.task_id, self.token)
        logger.warning("fenced-off %s refused", action, extra={**self._log_extra(), "action": action})
        _send(self.using, signals.stale_write_refused, key=self.key, tenant=self.tenant,
              token=self.token, owner=self.owner, action=action)
        raise StaleClaim(self.key, self.tenant, self.token, action)

    def _finish(self, action: str, set_sql: str, params: list[Any], outcomes: tuple[str, str]) -> str:
        backend = self._backend
        finishing, self._finishing = self._finishing, True
        try:
            with _write_scope(backend, self.using), connections[self.using].cursor() as cursor:
                status = backend.finish(cursor, self.task_id, self.token, set_sql, params, outcomes, settings.AUDIT)
        except BaseException:
            self._finishing = finishing  # nothing written: keepalive goes on heartbeating
            raise
        if status is None:
            self._finishing = finishing  # fenced off: this claim did not finish the task
            self._refuse(action)
        return str(status)

    def heartbeat(self, lease: float | timedelta | None = None) -> datetime | None:
        """Extend the lease from the database's now; ``StaleClaim`` if another worker took over."""
        seconds = lease_seconds(self.lease if lease is None else lease)
        with connections[self.using].cursor() as cursor:
            expires = self._backend.heartbeat(cursor, self.task_id, self.token, seconds)
        if expires is None:
            if self._finishing:  # keepalive raced our own completion: nothing to count
                raise StaleClaim(self.key, self.tenant, self.token, "heartbeat")
            self._refuse("heartbeat")
        if in_transaction(self.using):
            self._row_held = True  # the row stays locked by this transaction until it ends
        self.lease, self.lease_expires_at = seconds, expires
        return expires

    def complete(self, result: Any = None, result_ref: str = "") -> None:
        """Store the result (JSON and/or an artifact reference) and mark the task SUCCEEDED.

        The result is encoded with ``TASKCLAIM_JSON_ENCODER`` (``Decimal``, ``datetime``,
        ``UUID`` read back as strings by default). A result that cannot be stored raises
        ``InvalidResult`` and writes nothing: the claim is still held. Code that already ran the
        work should use :func:`complete_or_fail`, which ends the task FAILED instead.
        """
        result_json = None
        if result is not None:
            result_json = to_json(result, "result", InvalidResult, limit=settings.MAX_RESULT_BYTES,
                                  limit_setting="TASKCLAIM_MAX_RESULT_BYTES",
                                  hint=". Store large outputs elsewhere and pass result_ref")
        if not isinstance(result_ref, str):
            raise InvalidResult(f"result_ref must be a string of at most {MAX_RESULT_REF_LENGTH} characters")
        validate_text(result_ref, "result_ref", MAX_RESULT_REF_LENGTH, InvalidResult)
        self._finish(
            "complete",
            f"status = 'succeeded', result = {self._backend.json_param}, result_ref = %s, error = ''",
            [result_json, result_ref],
            ("succeeded", "succeeded"),
        )
        logger.info("task completed", extra=self._log_extra())
        _send(self.using, signals.task_completed, claim=self, result=result, result_ref=result_ref)

    def fail(self, error: BaseException | str, retry: bool = False) -> str:
        """Record a failure: back to PENDING when ``retry`` and attempts remain, else FAILED.

        Returns the new status. The error's text is stored made safe (NULs dropped, lone
        surrogates escaped, cut at 10,000 characters), so recording a failure never fails on it.
        """
        text = _error_text(error)
        again = "%s AND attempts < max_attempts"
        status = self._finish(
            "fail",
            f"status = CASE WHEN {again} THEN 'pending' ELSE 'failed' END, "
            f"owner = CASE WHEN {again} THEN '' ELSE owner END, error = %s",
            [bool(retry), bool(retry), text],
            ("retry", "failed"),
        )
        retrying = status == "pending"
        logger.info("task failed", extra={**self._log_extra(), "retry": retrying, "error": text[:200]})
        _send(self.using, signals.task_failed, claim=self, error=text, retry=retrying)
        return status

    def release(self) -> None:
        """Give the task back untouched: PENDING again, and this attempt does not count."""
        self._finish(
            "release",
            "status = 'pending', owner = '', attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END",
            [],
            ("released", "released"),
        )
        logger.info("task released", extra=self._log_extra())
        _send(self.using, signals.task_released, claim=self, key=self.key, tenant=self.tenant)

    def check(self) -> None:
        """Raise ``StaleClaim`` unless this claim still owns the task. Call it before an external effect."""
        with connections[self.using].cursor() as cursor:
            ok = self._backend.check(cursor, self.task_id, self.token)
        if not ok:
            self._refuse("check")

    @contextmanager
    def fenced(self) -> Iterator[Claim]:
        """A transaction whose writes commit only if this claim still owns the task.

        The task row is locked (the write lock on SQLite) *before* the token is checked, so no
        takeover can happen between the check and the commit. Complete inside the block to
        commit the effect and the completion together.
        """
        refused = False
        nested = in_transaction(self.using)
        db = connections[self.using]
        if not db.get_autocommit() and not db.in_atomic_block:
            # The caller turned autocommit off: the block joins its transaction, and the writes
            # commit (or roll back) with the caller's commit() (or rollback()).
            self._backend.join_callers_transaction(db)
        with transaction.atomic(using=self.using):
            with connections[self.using].cursor() as cursor:
                owned = self._backend.lock(cursor, self.task_id, self.token)
            if owned:
                held = self._row_held
                # Inside an outer transaction the lock outlives this block: keepalive may rest.
                self._row_held = held or nested
                try:
                    yield self
                except BaseException:
                    self._row_held = held  # the savepoint rolled back, and its lock with it
                    raise
            else:
                refused = True
        # Recorded after the (empty) transaction ended, so the count is not rolled back with it.
        if refused:
            self._refuse("fenced write")

    @contextmanager
    def keepalive(self, interval: float | None = None) -> Iterator[Claim]:
        """Heartbeat from a background thread every ``lease / 3`` seconds while the block runs.

        If a heartbeat is refused (another worker took over), or the database cannot be reached
        until the lease would have run out by this worker's own clock, ``claim.lost`` is set and
        ``StaleClaim`` is raised when the block ends: the work must not be published. Completing
        (or failing, releasing) the claim inside the block ends the heartbeats, with no error.

        Inside a transaction (``atomic()``, ``ATOMIC_REQUESTS``, autocommit off) the thread's
        heartbeats commit on its own connection, which works for a claim committed before the
        transaction began. A claim made inside the still-open transaction is invisible to other
        connections; its row lock holds the task until commit, so the thread only watches.
        """
        every = self.lease / 3 if interval is None else interval
        if isinstance(every, bool) or not isinstance(every, int | float) or not 0 < every < float("inf"):
            raise ValueError(f"keepalive interval must be a positive number of seconds, not {every!r}")
        outer = in_transaction(self.using)
        stop = threading.Event()
        thread = threading.Thread(target=self._beat, args=(stop, every, outer), daemon=True,
                                  name=f"taskclaim-keepalive-{self.token}")
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
        if self.lost.is_set() and not self._finishing:
            raise StaleClaim(self.key, self.tenant, self.token, "keepalive")

    def _beat(self, stop: threading.Event, every: float, outer: bool) -> None:
        # The local deadline may only make us give up early; the database decides expiry.
        deadline = time.monotonic() + self.lease
        limited = not outer
        try:
            while not stop.wait(every):
                if self._finishing:
                    return
                try:
                    if not limited:  # on first use: a short block never opens this connection
                        self._limit_lock_waits(min(every, 1.0))
                        limited = True
                    if outer and not self._free_to_beat():
                        # Held by the caller's open transaction: nobody can take over before it ends.
                        deadline = time.monotonic() + self.lease
                        continue
                    self.heartbeat()
                    deadline = time.monotonic() + self.lease
                except StaleClaim as exc:
                    if not self._finishing:
                        self._lose(exc)
                    return
                except DatabaseError as exc:
                    logger.warning("heartbeat failed: %s", exc, extra=self._log_extra())
                    if time.monotonic() >= deadline:
                        self._lose(exc)
                        return
                    # A session the server dropped never works again: close it so the next
                    # heartbeat opens a new one (whose lock-wait limit must be set again).
                    conn = connections[self.using]
                    conn.close_if_unusable_or_obsolete()
                    if conn.connection is None:
                        limited = not outer
        finally:
            if outer and limited:
                self._limit_lock_waits(None)
            connections[self.using].close()

    def _limit_lock_waits(self, seconds: float | None) -> None:
        """On this thread's connection: wait at most ``seconds`` for a lock (the caller's
        transaction may hold the task row, and waits for this thread at the end of the block).

        ``None`` restores the PostgreSQL default before the connection goes back (to a pool,
        perhaps); a SQLite connection is closed for good.
        """
        conn = connections[self.using]
        if seconds is None:
            if conn.vendor == "postgresql" and conn.connection is not None:
                try:
                    with conn.cursor() as cursor:
                        cursor.execute("RESET lock_timeout")
                except DatabaseError:  # the connection is gone: nothing to restore
                    pass
            return
        with conn.cursor() as cursor:
            if conn.vendor == "postgresql":
                cursor.execute("SELECT set_config('lock_timeout', %s, false)", [f"{int(seconds * 1000)}ms"])
            else:
                cursor.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")

    def _free_to_beat(self) -> bool:
        """From this thread's own connection: whether a heartbeat can and should be sent now.

        Not when the claim is not committed yet (made inside the caller's open transaction: the
        row shows no token or the previous one), nor while a transaction holds the row (the
        caller's ``fenced()`` or heartbeat: no one can take over meanwhile, and the heartbeat
        would wait for it). PostgreSQL answers both with ``SKIP LOCKED``, whoever holds the lock;
        SQLite has no row locks, so this claim's own record of holding the row is used. A
        larger token is a takeover: the heartbeat that follows reports it.
        """
        conn = connections[self.using]
        if conn.vendor == "postgresql":
            sql = f"SELECT fencing_token FROM {TASK} WHERE id = %s FOR NO KEY UPDATE SKIP LOCKED"  # noqa: S608
        elif self._row_held:
            return False
        else:
            sql = f"SELECT fencing_token FROM {TASK} WHERE id = %s"  # noqa: S608
        with conn.cursor() as cursor:
            cursor.execute(sql, [self.task_id])
            row = cursor.fetchone()
        return row is not None and row[0] >= self.token

    def _lose(self, exc: BaseException) -> None:
        self.lost_reason = exc
        self.lost.set()
        logger.warning("heartbeat lost: %s", exc, extra=self._log_extra())
        _send(self.using, signals.heartbeat_lost, claim=self, error=exc)


@dataclass
class ClaimOutcome:
    """What a claim attempt found: ``claimed`` with a ``claim``, or the task's current state."""

    claimed: bool
    claim: Claim | None
    task: Task


def _claim_from_row(row: tuple[Any, ...], backend: Backend, using: str, lease: float, delivery_id: str) -> Claim:
    return Claim(
        task_id=row[0], tenant=row[1], key=row[2], owner=row[4], token=row[5], attempt=row[6],
        lease=lease, lease_expires_at=backend.to_datetime(row[8]), using=using, delivery_id=delivery_id,
    )


def _announce(claim: Claim, previous_owner: str | None) -> None:
    takeover = previous_owner is not None
    logger.info("task %s", "taken over" if takeover else "claimed",
                extra={**claim._log_extra(), "previous_owner": previous_owner})
    _send(claim.using, signals.task_claimed, claim=claim, takeover=takeover)
    if takeover:
        _send(claim.using, signals.task_taken_over, claim=claim, previous_owner=previous_owner,
              previous_token=claim.token - 1)


def _max_attempts(value: int | None) -> int:
    return settings.MAX_ATTEMPTS if value is None else positive_int(value, "max_attempts")


def complete_or_fail(claim: Claim, result: Any = None, result_ref: str = "") -> None:
    """Complete ``claim`` for work that already ran; a result that cannot be stored ends it FAILED.

    ``complete()`` alone leaves the task RUNNING when it refuses a result, and the next claim
    after the lease would run the work a second time. Here the refusal is recorded as the
    final failure (the error names the problem) and ``InvalidResult`` propagates; a later call
    finds the task FAILED. Used by ``run_once`` and the Celery bridge.
    """
    try:
        claim.complete(result, result_ref)
    except InvalidResult as exc:
        _fail_quietly(claim, exc)
        raise
    except DataError as exc:
        # Something the checks above did not foresee; inside a transaction the database has
        # aborted it, and the caller's rollback decides.
        if in_transaction(claim.using):
            raise
        _fail_quietly(claim, exc)
        raise InvalidResult(f"the database refused the result: {exc}") from exc


def _fail_quietly(claim: Claim, error: BaseException) -> None:
    try:
        claim.fail(error, retry=False)
    except StaleClaim:
        logger.warning("failure of a fenced-off claim not recorded", extra=claim._log_extra())


def ensure(
    key: str | TaskKey, tenant: str = "", payload: Any = None, max_attempts: int | None = None, *,
    dispatch: dict[str, Any] | None = None, using: str | None = None,
) -> Task:
    """Create the task PENDING if ``(tenant, key)`` is absent; return it either way.

    A payload that differs from the stored one raises ``PayloadMismatch``; a payload given for
    a task created without one is stored.
    """
    return ensure_task(key, tenant, payload, max_attempts, dispatch=dispatch, using=using)[0]


def ensure_task(
    key: str | TaskKey, tenant: str = "", payload: Any = None, max_attempts: int | None = None, *,
    dispatch: dict[str, Any] | None = None, using: str | None = None,
) -> tuple[Task, bool]:
    """:func:`ensure`, also telling whether this call created the task."""
    from .models import Task

    key, tenant = resolve_identity(key, tenant)
    using = using or settings.DATABASE
    stored = payload_json(payload)
    fp = fingerprint_of(stored)
    dispatch_json = None if dispatch is None else canonical_json(dispatch, "dispatch")
    limit = _max_attempts(max_attempts)
    backend = get_backend(using)
    # The row that made the insert conflict can be purged before the read below: insert again.
    for _ in range(3):
        with connections[using].cursor() as cursor:
            row = backend.ensure(cursor, tenant=tenant, key=key, payload=stored, fingerprint=fp,
                                 max_attempts=limit, dispatch=dispatch_json)
        if row is not None:
            return backend.row_to_task(row, using), True
        task = Task.objects.using(using).filter(tenant=tenant, key=key).first()
        if task is not None:
            break
    else:
        raise TaskClaimError(f"task {key!r} (tenant {tenant!r}) kept vanishing under ensure(); try again")
    if fp and task.payload_fingerprint and task.payload_fingerprint != fp:
        raise PayloadMismatch(key, tenant, task.payload_fingerprint, fp)
    if fp and not task.payload_fingerprint:
        # The encoded form (what the encoder made of Decimal, datetime...), as a claim stores it.
        Task.objects.using(using).filter(pk=task.pk, payload_fingerprint="").update(
            payload=json.loads(stored) if stored is not None else None, payload_fingerprint=fp)
        task.refresh_from_db(using=using)
    return task, False


def claim(
    key: str | TaskKey, tenant: str = "", owner: str | None = None, lease: float | timedelta | None = None,
    payload: Any = None, *, max_attempts: int | None = None, delivery_id: str = "", using: str | None = None,
) -> ClaimOutcome:
    """Claim ``(tenant, key)``, creating the task if absent; take it over if its lease expired."""
    from .models import Task

    key, tenant = resolve_identity(key, tenant)
    seconds = lease_seconds(lease)
    owner = _owner(owner)
    validate_text(delivery_id, "delivery_id", MAX_OWNER_LENGTH)
    using = using or settings.DATABASE
    stored = payload_json(payload)
    fp = fingerprint_of(stored)
    limit = _max_attempts(max_attempts)
    backend = get_backend(using)
    audit = settings.AUDIT
    # A claim can lose to a change that makes the task claimable again (a release) between the
    # statement and the read below; try again a few times before reporting what we saw. A
    # task deleted by taskclaim_purge meanwhile (even between the read and the duplicate's
    # audit row) reads as absent: the next round creates it afresh and claims it.
    for _ in range(3):
        with _write_scope(backend, using), connections[using].cursor() as cursor:
            row, previous = backend.claim_key(
                cursor, tenant=tenant, key=key, owner=owner, lease=seconds, payload=stored,
                fingerprint=fp, max_attempts=limit, delivery_id=delivery_id, audit=audit)
        if row is not None:
            new = _claim_from_row(row, backend, using, seconds, delivery_id)
            _announce(new, previous)
            return ClaimOutcome(True, new, backend.row_to_task(row, using))
        with connections[using].cursor() as cursor:
            state, expired, duplicate = backend.read_state(
                cursor, tenant=tenant, key=key, owner=owner, fingerprint=fp, delivery_id=delivery_id,
                audit=audit, in_transaction=in_transaction(using))
        if state is None:
            continue  # purged between the statements: gone, so claim it afresh
        task = backend.row_to_task(state, using)
        if fp and task.payload_fingerprint not in ("", fp):
            raise PayloadMismatch(key, tenant, task.payload_fingerprint, fp)
        running = task.status == Task.Status.RUNNING
        if running and expired and task.attempts >= task.max_attempts:
            _fail_exhausted(task, using)
            task.refresh_from_db(using=using)
        elif task.status == Task.Status.PENDING or (running and expired):
            continue
        if duplicate:
            _announce_duplicate(task, owner, delivery_id, using)
        return ClaimOutcome(False, None, task)
    raise TaskClaimError(f"task {key!r} (tenant {tenant!r}) kept changing under the claim; try again")


def _announce_duplicate(task: Task, owner: str, delivery_id: str, using: str) -> None:
    logger.info("duplicate delivery", extra={"key": task.key, "tenant": task.tenant,
                                             "token": task.fencing_token, "owner": owner})
    _send(using, signals.duplicate_delivery, task=task, owner=owner, delivery_id=delivery_id)


def _fail_exhausted(task: Task, using: str) -> None:
    """End a task whose lease expired on its last attempt: FAILED, never claimed again."""
    from .models import Attempt, Task

    with transaction.atomic(using=using):
        moved = Task.objects.using(using).filter(
            pk=task.pk, status=Task.Status.RUNNING, fencing_token=task.fencing_token,
            lease_expires_at__lt=DbNow(),
        ).update(status=Task.Status.FAILED, error="lease expired with no attempts left",
                 lease_expires_at=None, updated_at=DbNow())
        if moved:
            Attempt.objects.using(using).filter(task_id=task.pk, token=task.fencing_token,
                                                outcome=Attempt.Outcome.RUNNING).update(
                outcome=Attempt.Outcome.EXPIRED, ended_at=DbNow())
    if moved:
        _send(using, signals.tasks_reclaimed, tasks=[(task.key, task.tenant, task.fencing_token, "failed")])


def claim_next(
    owner: str | None = None, lease: float | timedelta | None = None, tenant: str | None = None,
    limit: int = 1, *, delivery_id: str = "", using: str | None = None,
) -> list[Claim]:
    """Claim up to ``limit`` tasks, queue style: expired leases first, then the oldest pending."""
    seconds = lease_seconds(lease)
    positive_int(limit, "limit")
    if tenant is not None:
        _, tenant = resolve_identity("-", tenant)
    owner = _owner(owner)
    validate_text(delivery_id, "delivery_id", MAX_OWNER_LENGTH)
    using = using or settings.DATABASE
    backend = get_backend(using)
    with _write_scope(backend, using), connections[using].cursor() as cursor:
        rows = backend.claim_next(cursor, owner=owner, lease=seconds, tenant=tenant, limit=limit,
                                  delivery_id=delivery_id, audit=settings.AUDIT)
    claims = []
    for row, previous in rows:
        new = _claim_from_row(row, backend, using, seconds, delivery_id)
        _announce(new, previous)
        claims.append(new)
    return claims


def reclaim_expired_rows(limit: int | None = None, *, using: str | None = None) -> list[tuple[Any, ...]]:
    """Move expired RUNNING tasks to PENDING (FAILED when attempts are spent).

    Returns ``(id, key, tenant, token, new_status)`` for each task moved.
    """
    if limit is not None:
        positive_int(limit, "limit")
    using = using or settings.DATABASE
    backend = get_backend(using)
    with _write_scope(backend, using), connections[using].cursor() as cursor:
        rows = backend.reclaim(cursor, limit, settings.AUDIT)
    if rows:
        logger.info("reclaimed %d expired task(s)", len(rows))
        _send(using, signals.tasks_reclaimed, tasks=[(r[1], r[2], r[3], r[4]) for r in rows])
    return rows


def reclaim_expired(limit: int | None = None, *, using: str | None = None) -> int:
    return len(reclaim_expired_rows(limit, using=using))
