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

from django.db import DatabaseError, connections, transaction

from . import signals
from .aio import AsyncClaimMixin
from .backends import DbNow, get_backend
from .backends.base import Backend
from .conf import settings
from .exceptions import InvalidResult, PayloadMismatch, StaleClaim, TaskClaimError
from .keys import TaskKey, canonical_json, fingerprint, lease_seconds, resolve_identity

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

    transaction.on_commit(send, using=using)


def _write_scope(backend: Backend, using: str) -> AbstractContextManager[Any]:
    # SQLite runs multi-statement operations in one transaction (first statement a write).
    return transaction.atomic(using=using, savepoint=False) if backend.needs_transaction else nullcontext()


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, not {value!r}")
    return value


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
        with _write_scope(backend, self.using), connections[self.using].cursor() as cursor:
            status = backend.finish(cursor, self.task_id, self.token, set_sql, params, outcomes, settings.AUDIT)
        if status is None:
            self._refuse(action)
        return str(status)

    def heartbeat(self, lease: float | timedelta | None = None) -> datetime | None:
        """Extend the lease from the database's now; ``StaleClaim`` if another worker took over."""
        seconds = lease_seconds(self.lease if lease is None else lease)
        with connections[self.using].cursor() as cursor:
            expires = self._backend.heartbeat(cursor, self.task_id, self.token, seconds)
        if expires is None:
            self._refuse("heartbeat")
        self.lease, self.lease_expires_at = seconds, expires
        return expires

    def complete(self, result: Any = None, result_ref: str = "") -> None:
        """Store the result (JSON and/or an artifact reference) and mark the task SUCCEEDED."""
        result_json = None
        if result is not None:
            try:
                result_json = json.dumps(result, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise InvalidResult(f"result is not JSON-serialisable: {exc}") from exc
            size, limit = len(result_json.encode()), settings.MAX_RESULT_BYTES
            if size > limit:
                raise InvalidResult(
                    f"result is {size} bytes of JSON; TASKCLAIM_MAX_RESULT_BYTES allows {limit}. "
                    "Store large outputs elsewhere and pass result_ref"
                )
        if not isinstance(result_ref, str) or len(result_ref) > MAX_RESULT_REF_LENGTH:
            raise InvalidResult(f"result_ref must be a string of at most {MAX_RESULT_REF_LENGTH} characters")
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

        Returns the new status.
        """
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        text = text[:MAX_ERROR_LENGTH]
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
        with transaction.atomic(using=self.using):
            with connections[self.using].cursor() as cursor:
                owned = self._backend.lock(cursor, self.task_id, self.token)
            if owned:
                yield self
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
        ``StaleClaim`` is raised when the block ends: the work must not be published. Inside an
        ``atomic()`` block it does nothing: the transaction's row lock already holds the task.
        """
        if connections[self.using].in_atomic_block:
            # Inside a transaction (ATOMIC_REQUESTS, say) the claim's row stays locked until
            # commit, so no one can take over; a heartbeat from another connection could not
            # even see an uncommitted claim. Nothing to keep alive.
            yield self
            return
        every = interval if interval is not None else self.lease / 3
        stop = threading.Event()
        thread = threading.Thread(target=self._beat, args=(stop, every), daemon=True,
                                  name=f"taskclaim-keepalive-{self.token}")
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
        if self.lost.is_set():
            raise StaleClaim(self.key, self.tenant, self.token, "keepalive")

    def _beat(self, stop: threading.Event, every: float) -> None:
        # The local deadline may only make us give up early; the database decides expiry.
        deadline = time.monotonic() + self.lease
        try:
            while not stop.wait(every):
                try:
                    self.heartbeat()
                    deadline = time.monotonic() + self.lease
                except StaleClaim as exc:
                    self._lose(exc)
                    return
                except DatabaseError as exc:
                    logger.warning("heartbeat failed: %s", exc, extra=self._log_extra())
                    if time.monotonic() >= deadline:
                        self._lose(exc)
                        return
        finally:
            connections[self.using].close()

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
    return settings.MAX_ATTEMPTS if value is None else _positive_int(value, "max_attempts")


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
    fp = fingerprint(payload)
    payload_json = None if payload is None else canonical_json(payload, "payload")
    dispatch_json = None if dispatch is None else canonical_json(dispatch, "dispatch")
    backend = get_backend(using)
    with connections[using].cursor() as cursor:
        row = backend.ensure(cursor, tenant=tenant, key=key, payload=payload_json, fingerprint=fp,
                             max_attempts=_max_attempts(max_attempts), dispatch=dispatch_json)
    if row is not None:
        return backend.row_to_task(row, using), True
    task = Task.objects.using(using).get(tenant=tenant, key=key)
    if fp and task.payload_fingerprint and task.payload_fingerprint != fp:
        raise PayloadMismatch(key, tenant, task.payload_fingerprint, fp)
    if fp and not task.payload_fingerprint:
        Task.objects.using(using).filter(pk=task.pk, payload_fingerprint="").update(
            payload=payload, payload_fingerprint=fp)
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
    owner = owner or default_owner()
    using = using or settings.DATABASE
    fp = fingerprint(payload)
    payload_json = None if payload is None else canonical_json(payload, "payload")
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
                cursor, tenant=tenant, key=key, owner=owner, lease=seconds, payload=payload_json,
                fingerprint=fp, max_attempts=limit, delivery_id=delivery_id, audit=audit)
        if row is not None:
            new = _claim_from_row(row, backend, using, seconds, delivery_id)
            _announce(new, previous)
            return ClaimOutcome(True, new, backend.row_to_task(row, using))
        with connections[using].cursor() as cursor:
            state, expired, duplicate = backend.read_state(
                cursor, tenant=tenant, key=key, owner=owner, fingerprint=fp, delivery_id=delivery_id,
                audit=audit, in_transaction=connections[using].in_atomic_block)
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
    _positive_int(limit, "limit")
    if tenant is not None:
        _, tenant = resolve_identity("-", tenant)
    owner = owner or default_owner()
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
        _positive_int(limit, "limit")
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
