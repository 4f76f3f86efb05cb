"""The claim a worker holds: its token fences every write it makes to the task."""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections, transaction

from .. import signals
from ..conf import settings
from ..exceptions import CommitUnconfirmed, InvalidArgument, InvalidResult, StaleClaim, TaskClaimError
from ..idempotency import fencing_headers
from ..idempotency import idempotency_key as _idempotency_key
from ..identity import resolve_identity
from ..routing import UNREACHABLE, route, unreachable
from ..status import Status
from ..store.rows import Claimed, Start, TaskRow
from ..values import (
    DEFAULT_QUEUE,
    clean_text,
    lease_seconds,
    positive_int,
    progress_of,
    queue_names,
    to_json,
    validate_text,
)
from . import progress as _progress
from . import transitions
from .keepalive import KeepaliveMixin
from .outbox import Outbox
from .readonly import writes_only_to
from .steps import Steps

logger = logging.getLogger("django_taskclaim")

T = TypeVar("T")

MAX_ERROR_LENGTH = 10_000
MAX_RESULT_REF_LENGTH = 1024


MAX_TRACEBACK_LENGTH = 64_000
#: Seconds at most that a reserved claim (a batch's task claimed with the others, not started yet)
#: holds its task before another worker may take it: a worker that dies, or that is busy with a
#: long task, does not keep its batch-mates from the others for a whole lease.
RESERVATION = 5.0
_LOST_LOCK = threading.Lock()


def failure_details(error: object) -> tuple[str, str]:
    """An exception's class path and formatted traceback (empty for a text error); never raises."""
    if not isinstance(error, BaseException):
        return "", ""
    kind = type(error)
    try:
        trace = "".join(traceback.format_exception(error))
    except Exception:  # a broken __str__ or traceback must not stop the failure being recorded
        trace = f"{kind.__module__}.{kind.__qualname__}: <traceback could not be formatted>\n"
    return clean_text(f"{kind.__module__}.{kind.__qualname__}", 255), clean_text(trace, MAX_TRACEBACK_LENGTH)


def _delay(value: float | timedelta) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds <= settings.MAX_LEASE:
        raise InvalidArgument(f"a retry delay must be between 0 and {settings.MAX_LEASE:g} seconds, not {value!r}")
    return float(seconds)


def error_text(error: object) -> str:
    """The text stored for a failure; never raises, whatever ``error`` holds or how it prints."""
    try:
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    except Exception:  # an exception whose __str__ fails must still be recorded
        text = f"{type(error).__name__}: <unprintable error>"
    return clean_text(text, MAX_ERROR_LENGTH)



class _Overran(Exception):
    """A fenced() block ended after the attempt's timeout: rolled back, then refused."""

class Claim(KeepaliveMixin):
    """Proof that this worker owns a task until its lease expires: the token fences every write.

    Every method that writes has an awaitable twin (``acomplete``…, ``akeepalive``,
    ``afenced``), which runs the sync method on Django's ORM thread (``sync_to_async``, as
    Django's own ``a*`` queryset methods do): one implementation of each rule.
    """

    def __init__(
        self, *, task_id: int, key: str, tenant: str, token: int, owner: str, lease: float,
        lease_expires_at: datetime | None, attempt: int, using: str, delivery_id: str = "",
        sent: float | None = None,
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
        #: The task's payload as it was claimed (``None`` when the claim was built by hand).
        self.payload: Any = None
        #: Queued work: its queue and the path of the callable that runs it ('' for a handler).
        self.queue: str | None = None
        self.task_path = ""
        #: The task row as it was claimed (``None`` when the claim was built by hand).
        self.row: TaskRow | None = None
        self._lost: threading.Event | None = None  # see lost
        self.lost_reason: BaseException | None = None
        # complete/fail/release under way or done: a refused heartbeat then means nothing was lost.
        self._finishing = False
        # The status this claim's own complete/fail/release left the task in, and whether that
        # write is known to have committed (see ended()).
        self._ended: str | None = None
        self._ended_committed = False
        self._rolled_back = 0  # endings of this claim that were rolled back
        self._stored: str | None = None  # the JSON its complete() stored
        # By this process's monotonic clock, the earliest the lease can run out: counted from
        # before the statement that set it was sent. Timers of this worker go by it (a worker's
        # clock may only make it stop early); the database decides expiry.
        self._deadline = (time.monotonic() if sent is None else sent) + lease
        # This thread's open transaction holds the task row (fenced(), a heartbeat inside it):
        # nobody can take over until it ends, and a heartbeat from another connection would wait.
        # (Consulted on SQLite only; PostgreSQL asks the row's lock itself.)
        self._row_held = False
        # The keepalive thread beating now, whose own short transactions hold nothing after.
        self._beating: threading.Thread | None = None
        #: Kept alive with the process's other claims of its database, one statement a round for
        #: all (:mod:`~django_taskclaim.lifecycle.renewal`), not by a heartbeat thread of its own.
        #: A worker running several tasks at once sets it on each.
        self.renew_together = False
        #: Claimed for later and not started yet (a batch's task after its first): its attempt is
        #: not counted and it holds a short reservation, until :meth:`start` (or the ending of the
        #: task run before it, :meth:`then_start`) starts it. Never run a reserved claim.
        self.reserved = False
        # The reserved claim this claim's ending starts in its own commit, and how that went.
        self._successor: Claim | None = None
        self._carried: Start | None = None
        self._ending_sent = 0.0  # when the ending that carried a start was sent (monotonic)
        # fenced() blocks open on this claim whose token check passed: the outbox records only then.
        self._fences = 0
        # By this process's monotonic clock, when the attempt's timeout runs out (deadlines.watch()
        # sets it): a fenced() block past it rolls back, even before the watcher fenced the claim off.
        self.timeout_at: float | None = None
        # The task's stored steps, read at the first step() (see steps).
        self._steps: Steps | None = None

    @classmethod
    def taken(cls, claimed: Claimed, using: str, lease: float, delivery_id: str = "", *, sent: float,
              reserve: float | None = None) -> Claim:
        """The claim for a row this worker just claimed (by a statement sent at ``sent``, this
        process's monotonic clock), announced to logs and receivers. A reserved one (held for
        ``reserve`` seconds) counts its attempt when it starts."""
        row = claimed.row
        reserved = claimed.reserved and reserve is not None
        new = cls(task_id=row.id, tenant=row.tenant, key=row.key, owner=row.owner, token=row.fencing_token,
                  attempt=row.attempts + 1 if reserved else row.attempts, lease=lease,
                  lease_expires_at=row.lease_expires_at, using=using, delivery_id=delivery_id, sent=sent)
        if reserved:
            new.reserved, new._deadline = True, sent + (reserve or lease)
        new.payload = row.payload
        new.queue, new.task_path, new.row = row.queue, row.task_path, row
        transitions.announce_claim(new, claimed.previous_owner)
        return new

    def __repr__(self) -> str:
        return f"<Claim {self.key!r} tenant={self.tenant!r} token={self.token} owner={self.owner!r}>"

    @property
    def lost(self) -> threading.Event:
        """Set by keepalive() when a heartbeat is refused or the lease ran out locally. Made on
        first use: most claims of a busy queue never need one."""
        event = self._lost
        if event is None:
            with _LOST_LOCK:  # the heartbeat thread and the owner may ask at once: one event
                if self._lost is None:
                    self._lost = threading.Event()
                event = self._lost
        return event

    def log_extra(self) -> dict[str, Any]:
        """The structured fields of a log record about this claim (``logger.info(..., extra=claim.log_extra())``):
        key, tenant, token, owner, and the task's path and id where it has them."""
        return transitions._log(self)

    def named(self) -> transitions.Named:
        """The task as log messages name it (its path, id, key, tenant, token, owner)."""
        return transitions.Named(self)

    def overran(self) -> bool:
        """Whether the attempt has run past its timeout (by this process's clock)."""
        return self.timeout_at is not None and time.monotonic() >= self.timeout_at

    def _refuse(self, action: str) -> None:
        """Count the fenced-off write in the audit trail, tell receivers, raise ``StaleClaim``."""
        transitions.refuse(self, action)
        raise StaleClaim(self.key, self.tenant, self.token, action)

    # -- reserved claims: started when they run, so that only what started pays for a death --
    def start(self) -> None:
        """Start this reserved claim (nothing to do for one that is not reserved): its attempt
        counts from now and its lease is the full one. ``StaleClaim`` when another worker took it
        over meanwhile (its reservation ran out): it must not run here."""
        if not self.reserved:
            return
        if self._started(time.monotonic(), transitions.start(self, self.lease)) is None:
            raise StaleClaim(self.key, self.tenant, self.token, "start")

    def then_start(self, successor: Claim | None) -> None:
        """Start reserved claim ``successor`` in the commit of this claim's ending (complete, fail,
        release): the next task of a batch starts with no round trip of its own. Whether it did is
        :meth:`started_by`'s answer."""
        self._successor = successor if successor is not None and successor.reserved else None

    def started_by(self, previous: Claim | None) -> bool | None:
        """Whether ``previous``'s committed ending started this reserved claim (``True``), found it
        taken over (``False``), or did not start it (``None``: start it with :meth:`start`)."""
        if not self.reserved:
            return True
        carried = previous._carried if previous is not None else None
        if carried is None or carried.task_id != self.task_id or not carried.tried or previous is None:
            return None
        if previous.ended() is None:  # the ending (and the start with it) was rolled back
            return None
        return self._started(previous._ending_sent, carried.expires) is not None

    def _started(self, sent: float, expires: datetime | None) -> datetime | None:
        if expires is not None:
            self.reserved, self.lease_expires_at, self._deadline = False, expires, sent + self.lease
        return expires

    def _start_spec(self) -> Start | None:
        """What this claim's ending carries: the start of its reserved successor, if any."""
        successor = self._successor
        if successor is None or not successor.reserved:
            return None
        return Start(successor.task_id, successor.token, successor.owner, successor.lease, successor.delivery_id)

    def _finishing_write(self, action: str, write: Any, *args: Any) -> str:
        """Run an ending transition (complete, fail, release); ``StaleClaim`` if fenced off, or
        when a completion comes after the attempt's timeout (its end is then the timeout's)."""
        if action == "complete" and self.overran():
            self._refuse(action)
        if self.reserved and action != "release":
            self.start()  # a reserved claim that ran after all: its attempt counts
        finishing, self._finishing = self._finishing, True
        carried = self._start_spec()
        if carried is not None:
            args = (*args, carried)
        self._ending_sent = time.monotonic()
        try:
            status = write(self, *args)
        except BaseException:
            self._finishing = finishing  # nothing written: keepalive goes on heartbeating
            raise
        if status is None:
            self._finishing = finishing  # fenced off: this claim did not finish the task
            self._refuse(action)
        self._carried = carried
        self._record_ending(str(status))
        return str(status)

    def _record_ending(self, status: str) -> None:
        self._ended = status
        # Outside a transaction the write has committed; inside one, it commits with it (or not).
        self._ended_committed = not transitions.in_transaction(self.using)

    def _forget_ending(self) -> None:
        """This claim's ending was rolled back: the claim holds the task again."""
        self._ended, self._ended_committed, self._finishing = None, False, False
        self._carried = None  # a start it carried was rolled back with it
        self._rolled_back += 1

    @property
    def completed_with(self) -> Any:
        """The result this claim's ``complete()`` stored, as a later read returns it (JSON)."""
        return None if self._stored is None else json.loads(self._stored)

    def as_task(self) -> Any:
        """The task as this claim made it (a ``Task`` built from the claimed row, no query)."""
        if self.row is None:
            raise TaskClaimError("this claim was built by hand: it holds no row")
        return transitions.to_task(self.row, self.using)

    def remaining(self) -> float:
        """Seconds of lease left at least, by this process's clock (negative once it may have run out)."""
        return self._deadline - time.monotonic()

    def ended(self) -> str | None:
        """The status this claim's own complete, fail or release left the task in, if it holds.

        ``None`` when the claim has not ended itself, or its ending was rolled back with the
        transaction it was written in (a ``complete()`` inside an ``atomic()`` block that then
        rolled back): the claim then still holds the task. An ending written inside a
        transaction that is still open counts, as it commits or rolls back with it. Costs one
        read only for an ending written inside a transaction that has ended since.
        """
        if self._ended is None or self._ended_committed:
            return self._ended
        if transitions.in_transaction(self.using):
            return self._ended  # still open: it ends (commits or not) with the caller's transaction
        if transitions.check(self):  # running under our token again: the ending was rolled back
            self._forget_ending()
            return None
        self._ended_committed = True
        return self._ended

    @staticmethod
    def _result_json(result: Any, result_ref: str) -> str | None:
        """The result as stored JSON; ``InvalidResult`` for what cannot be stored."""
        if not isinstance(result_ref, str):
            raise InvalidResult(f"result_ref must be a string of at most {MAX_RESULT_REF_LENGTH} characters")
        validate_text(result_ref, "result_ref", MAX_RESULT_REF_LENGTH, InvalidResult)
        if result is None:
            return None
        return to_json(result, "result", InvalidResult, limit=settings.MAX_RESULT_BYTES,
                       limit_setting="TASKCLAIM_MAX_RESULT_BYTES",
                       hint=". Store large outputs elsewhere and pass result_ref")

    def heartbeat(self, lease: float | timedelta | None = None) -> datetime | None:
        """Extend the lease from the database's now; ``StaleClaim`` if another worker took over."""
        seconds = lease_seconds(self.lease if lease is None else lease)
        sent = time.monotonic()
        expires = transitions.heartbeat(self, seconds)
        if expires is None:
            if self._finishing:  # keepalive raced our own completion: nothing to count
                raise StaleClaim(self.key, self.tenant, self.token, "heartbeat")
            self._refuse("heartbeat")
        if transitions.in_transaction(self.using) and threading.current_thread() is not self._beating:
            self._row_held = True  # the owner's transaction keeps the row locked until it ends
        self.lease, self.lease_expires_at, self._deadline = seconds, expires, sent + seconds
        return expires

    def complete(self, result: Any = None, result_ref: str = "") -> None:
        """Store the result (JSON and/or an artifact reference) and mark the task SUCCEEDED.

        The result is encoded with ``TASKCLAIM_JSON_ENCODER`` (``Decimal``, ``datetime``,
        ``UUID`` read back as strings by default). A result that cannot be stored raises
        ``InvalidResult`` and writes nothing: the claim is still held. Code that already ran the
        work should use :func:`complete_or_fail`, which ends the task FAILED instead.
        """
        result_json = self._result_json(result, result_ref)
        self._finishing_write("complete", transitions.complete, result_json, result_ref)
        self._stored = result_json
        if logger.isEnabledFor(logging.INFO):
            logger.info("task completed: %s", self.named(), extra=self.log_extra())
        transitions.send(self.using, signals.task_completed, claim=self, result=result, result_ref=result_ref)

    def complete_and_claim_next(
        self, result: Any = None, result_ref: str = "", *, limit: int = 1, tenant: str | None = None,
        lease: float | timedelta | None = None, queue: str | Sequence[str] | None = None, path: str | None = None,
        reserve: bool = False,
    ) -> list[Claim]:
        """Complete this task and claim the next ones (queue style, as ``claim_next``) in one commit.

        The loop of a queue worker: one statement and one commit per task on PostgreSQL, where
        ``complete()`` then ``claim_next()`` cost two. The claims are made for this claim's owner,
        with its lease unless ``lease`` is given, from ``queue`` (default: this task's queue) and
        of its ``path`` kind, only if the completion is accepted: a fenced-off claim raises
        ``StaleClaim`` and claims nothing. A result that cannot be stored raises
        ``InvalidResult`` and writes nothing, as ``complete()`` does. Without ``tenant`` the next
        tasks come from this task's database; a ``tenant`` whose tasks are in another one
        (``TASKCLAIM_ROUTER``) gets its claims there, after this completion's own commit.
        ``reserve``: as ``claim_next(reserve=True)``, the claims after the first are reserved.
        """
        seconds = self.lease if lease is None else lease_seconds(lease)
        held = reservation(seconds) if reserve else None
        positive_int(limit, "limit")
        if tenant is not None:
            _, tenant = resolve_identity("-", tenant)
        queues = queue_names(queue if queue is not None else self.queue or DEFAULT_QUEUE)
        path = ("*" if self.task_path else "") if path is None else path
        if tenant is not None and (home := route(tenant)) != self.using:
            # One statement cannot span two databases: complete here, then claim in the tenant's.
            self.complete(result, result_ref)
            try:
                return claim_next_in(home, owner=self.owner, lease=seconds, tenant=tenant, limit=limit,
                                     delivery_id=self.delivery_id, queues=queues, path=path, reserve=reserve)
            except UNREACHABLE as exc:
                unreachable(exc, home, tenant)
        result_json = self._result_json(result, result_ref)
        if self.overran():
            self._refuse("complete")  # past the timeout: the attempt's end is TimedOut, not this
        finishing, self._finishing = self._finishing, True
        sent = time.monotonic()
        try:
            status, claimed = transitions.complete_and_claim_next(
                self, result_json, result_ref, owner=self.owner, lease=seconds, tenant=tenant, limit=limit,
                delivery_id=self.delivery_id, queues=queues, path=path, reserve=held)
        except BaseException:
            self._finishing = finishing
            raise
        if status is None:
            self._finishing = finishing
            self._refuse("complete")
        self._record_ending(str(status))
        self._stored = result_json
        if logger.isEnabledFor(logging.INFO):
            logger.info("task completed: %s", self.named(), extra=self.log_extra())
        transitions.send(self.using, signals.task_completed, claim=self, result=result, result_ref=result_ref)
        return [Claim.taken(c, self.using, seconds, self.delivery_id, sent=sent, reserve=held) for c in claimed]

    def fail(self, error: BaseException | str, retry: bool = False, delay: float | timedelta | None = None) -> str:
        """Record a failure: back to PENDING when ``retry`` and attempts remain, else FAILED.

        Returns the new status. The error's text is stored made safe (NULs dropped, lone
        surrogates escaped, cut at 10,000 characters), so recording a failure never fails on it;
        an exception's class and traceback are kept on the attempt row too. A queued task
        retried may not run again before ``delay`` seconds (default: ``TASKCLAIM_RETRY_BACKOFF``
        for this attempt); a task claimed by key is retried by its next claim.
        """
        text = error_text(error)
        error_class, trace = failure_details(error)
        wait = _delay(delay) if delay is not None else (
            settings.RETRY_BACKOFF.delay(self.attempt) if retry and self.queue is not None else None)
        status = self._finishing_write("fail", transitions.fail, text, bool(retry), wait, error_class, trace)
        retrying = status == Status.PENDING
        logger.info("task failed%s: %s: %s", ", to be retried" if retrying else "", self.named(), text[:200],
                    extra={**self.log_extra(), "retry": retrying, "error": text[:200]})
        transitions.send(self.using, signals.task_failed, claim=self, error=text, retry=retrying)
        return status

    def release(self, *, delay: float | timedelta | None = None, reason: str | None = None) -> None:
        """Release the task untouched: PENDING again, and this attempt does not count (a reserved
        claim, never started, counted none). ``delay``: a queued task is not handed out again
        before that many seconds; ``reason``: why, kept as the task's ``error`` for operators."""
        wait = None if delay is None else _delay(delay)
        why = None if reason is None else error_text(reason)
        if self.reserved and wait is None and why is None:
            self._finishing_write("release", lambda holder, *_: transitions.unreserve(holder))
            self.reserved = False
        else:
            self.start()  # a reserved one: its release then uncounts the attempt it counted
            self._finishing_write("release", lambda holder, start=None: transitions.release(holder, start, wait, why))
        logger.info("task released: %s", self.named(), extra=self.log_extra())
        transitions.send(self.using, signals.task_released, claim=self, key=self.key, tenant=self.tenant)

    def check(self) -> None:
        """Raise ``StaleClaim`` unless this claim still owns the task. Call it before an external effect."""
        if not transitions.check(self):
            self._refuse("check")

    # -- effects beyond the database (issue 34; the contract: docs/downstream.md) ------------
    def idempotency_key(self, effect: str = "") -> str:
        """The key a downstream recognises this task's call ``effect`` by, whichever attempt sends it.

        ``tc1-`` and a SHA-256 of tenant, key and effect; no token or owner, so a retry by
        another worker sends the same key. Pure: no query, usable from any thread.
        """
        return _idempotency_key(self.tenant, self.key, effect)

    def headers(self, effect: str = "") -> dict[str, str]:
        """The HTTP headers of a call to a downstream: ``Idempotency-Key`` for ``effect``, and the
        task's ``Taskclaim-Fencing-Key`` with this claim's ``Taskclaim-Fencing-Token``."""
        return fencing_headers(self.tenant, self.key, self.token, effect)

    # -- durable steps (issue 43; lifecycle/steps.py) ---------------------------------------------
    def _durable(self) -> Steps:
        """This claim's durable steps (the task's stored results, read once, at the first step)."""
        if self._steps is None:
            self._steps = Steps(self)
        return self._steps

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Step ``name`` of this task: its stored result, else ``fn(*args, **kwargs)``, stored.

        The first time the step returns, its result is stored under the task by a fenced write; a
        later attempt (a crash, a takeover, a retry) gets it without calling ``fn`` again. ``name`` is
        unique within the task (a second step of one name gets the first one's result). The result is
        returned as it is stored and read back (JSON: a tuple comes back a list, a ``Decimal`` a
        string, by ``TASKCLAIM_JSON_ENCODER``), the same on every attempt; one that cannot be stored
        raises ``InvalidArgument`` and stores nothing. An error ``fn`` raises is not stored. A claim
        fenced off stores nothing (``StaleClaim``). ``claim.idempotency_key(effect=name)`` keys the
        step's external call. Options (a timeout): :meth:`step_with`.
        """
        return self._durable().run(name, fn, args, kwargs)

    def step_with(self, name: str, *, timeout: float | None = None) -> Callable[..., Any]:
        """:meth:`step` with its options given first: ``claim.step_with(name, timeout=30)(fn, *args,
        **kwargs)``, so that no keyword of ``fn`` (``timeout`` above all) is taken for an option.

        ``timeout``: seconds the step's function may run. A sync function cannot be stopped: when it
        returns past its timeout, its result is not stored and ``TimedOut`` is raised. An async one
        (:meth:`astep_with`) is cancelled at its timeout. Either way the attempt fails with
        ``TimedOut`` unless the body catches it, and the step runs again on the next attempt.
        """
        return lambda fn, /, *args, **kwargs: self._durable().run(name, fn, args, kwargs, timeout)

    async def astep(self, name: str, afn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any) -> Any:
        """:meth:`step`, awaitable: awaits ``afn(*args, **kwargs)`` unless the step is stored; the
        stored steps are read and written on Django's ORM thread."""
        return await self._durable().arun(name, afn, args, kwargs)

    def astep_with(self, name: str, *, timeout: float | None = None) -> Callable[..., Awaitable[Any]]:
        """:meth:`step_with`, awaitable: ``await claim.astep_with(name, timeout=30)(afn, *args)``; past
        its timeout the function is cancelled, nothing is stored and ``TimedOut`` is raised."""
        return lambda afn, /, *args, **kwargs: self._durable().arun(name, afn, args, kwargs, timeout)

    @property
    def outbox(self) -> Outbox:
        """Messages to send once this claim's ``fenced()`` block commits (:mod:`.outbox`):
        ``claim.outbox.http(method, url, json=..., effect=...)``, recorded in the block's transaction."""
        return Outbox(self)

    @contextmanager
    def fenced(self) -> Iterator[Claim]:
        """A transaction whose writes commit only if this claim still owns the task.

        The task row is locked (the write lock on SQLite) *before* the token is checked, so no
        takeover can happen between the check and the commit. Complete inside the block to
        commit the effect and the completion together.

        The block's writes must go to the claim's database (``using``): a write to another one
        would commit on its own, whatever becomes of the claim, so it raises ``TaskClaimError``
        before it is sent (and the block rolls back). ``routing.fenced_database()`` names the
        claim's database meanwhile, for a database router to send the effect's model there.
        """
        refused = False
        nested = transitions.in_transaction(self.using)
        db = connections[self.using]
        if not db.get_autocommit() and not db.in_atomic_block:
            # The caller turned autocommit off: the block joins its transaction, and the writes
            # commit (or roll back) with the caller's commit() (or rollback()).
            transitions.join_callers_transaction(self.using)
        ending = self._ended
        if not nested:
            transitions.unconfirmed_commit(self.using)  # forget a warning from before: only this commit's
        try:
            with transaction.atomic(using=self.using), writes_only_to(self.using, self.key, self.tenant):
                # Past the attempt's timeout the claim is lost even if the watcher has not fenced it
                # off yet (a paused or starved process wakes with both due at once): checked once the
                # row is locked, and again before the COMMIT.
                if transitions.lock(self) and not self.overran():
                    held = self._row_held
                    # Inside an outer transaction the lock outlives this block: keepalive may rest.
                    self._row_held = held or nested
                    self._fences += 1
                    try:
                        yield self
                        if self.overran():
                            raise _Overran
                    except BaseException:
                        self._row_held = held  # the savepoint rolled back, and its lock with it
                        raise
                    finally:
                        self._fences -= 1
                else:
                    refused = True
        except BaseException as exc:
            # The block rolled back, by an error in it or a COMMIT that failed (the server gone
            # at that moment): an ending written in it went with it, and the claim holds the
            # task as it did before.
            if self._ended is not None and ending is None:
                self._forget_ending()
            if not isinstance(exc, _Overran):
                raise
            refused = True
        if not nested and self._ended is not None and ending is None:
            self._ended_committed = True  # written in this block, which has just committed
        if not nested and not refused and transitions.unconfirmed_commit(self.using):
            # Done on the primary, perhaps not on its standby: the body must not go on trusting it.
            raise CommitUnconfirmed(
                f"the fenced() block of {self.key!r} (token {self.token}) was committed on the primary, but "
                "its wait for the synchronous standby was cancelled: a failover may lose what it wrote")
        # Recorded after the (empty) transaction ended, so the count is not rolled back with it.
        if refused:
            self._refuse("fenced write")

    # -- the awaitable twins: each runs its sync method on Django's ORM thread ------------------
    async def aheartbeat(self, lease: float | timedelta | None = None) -> datetime | None:
        """:meth:`heartbeat`, awaitable."""
        return await sync_to_async(self.heartbeat)(lease)

    async def acomplete(self, result: Any = None, result_ref: str = "") -> None:
        """:meth:`complete`, awaitable."""
        await sync_to_async(self.complete)(result, result_ref)

    async def afail(self, error: BaseException | str, retry: bool = False,
                    delay: float | timedelta | None = None) -> str:
        """:meth:`fail`, awaitable (``delay`` too); returns the new status."""
        return await sync_to_async(self.fail)(error, retry, delay)

    async def arelease(self, *, delay: float | timedelta | None = None, reason: str | None = None) -> None:
        """:meth:`release`, awaitable."""
        await sync_to_async(self.release)(delay=delay, reason=reason)

    async def astart(self) -> None:
        """:meth:`start`, awaitable: ``StaleClaim`` if the reserved claim was taken over."""
        await sync_to_async(self.start)()

    async def acheck(self) -> None:
        """:meth:`check`, awaitable: ``StaleClaim`` unless this claim still owns the task."""
        await sync_to_async(self.check)()

    async def afenced(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run the sync ``func(*args, **kwargs)`` inside :meth:`fenced` on the ORM's thread.

        Django has no async transactions, so the fenced block cannot span ``await``\\ s: put
        the effect's ORM writes (and ``claim.complete(...)``, to commit them together) in one
        sync function. Its writes commit only if this claim still owns the task; otherwise
        ``StaleClaim`` is raised and nothing is written. Returns what ``func`` returns.
        """

        def run() -> T:
            with self.fenced():
                return func(*args, **kwargs)

        return await sync_to_async(run)()

    # -- progress (issue 45): a fenced write the admin, taskclaim_inspect and the dashboard show --
    def progress(self, fraction: float, note: str = "") -> None:
        """Record how far the work has come: ``fraction`` from 0 to 1 and a short ``note`` (at most
        255 characters), with this claim's token. Fenced as every write: ``StaleClaim`` (and nothing
        written) once another claim holds the task; ``InvalidArgument`` (nothing written) for a
        fraction that is not a number in [0, 1] or a note the database cannot store."""
        value, text = progress_of(fraction, note)
        if not _progress.write(self, value, text):
            self._refuse("progress")

    async def aprogress(self, fraction: float, note: str = "") -> None:
        """:meth:`progress`, awaitable."""
        await sync_to_async(self.progress)(fraction, note)


def reservation(lease: float) -> float:
    """Seconds a reserved claim (claimed, not started) holds its task: :data:`RESERVATION`, or the
    lease where that is shorter. A worker that dies gives its reserved tasks back after this."""
    return min(lease, RESERVATION)


def claim_next_in(
    using: str, *, owner: str, lease: float, tenant: str | None, limit: int, delivery_id: str,
    queues: Sequence[str], path: str, reserve: bool = False,
) -> list[Claim]:
    """Up to ``limit`` queued tasks claimed in database ``using`` (validated arguments): each claim
    aged from before its statement was sent, so a slow round trip never makes a lease look longer.
    ``reserve``: only the first to run is started, the others reserved (see ``Claim.reserved``)."""
    held = reservation(lease) if reserve else None
    sent = time.monotonic()
    claimed = transitions.claim_next(using, owner=owner, lease=lease, tenant=tenant, limit=limit,
                                     delivery_id=delivery_id, queues=queues, path=path, reserve=held)
    return [Claim.taken(c, using, lease, delivery_id, sent=sent, reserve=held) for c in claimed]
