"""Exceptions raised by django-taskclaim.

Every error the app raises derives from :class:`TaskClaimError`; errors about bad input also
derive from ``ValueError`` so callers that validate input generically keep working.
"""

from __future__ import annotations

from typing import Any

from django.db import OperationalError


class TaskClaimError(Exception):
    """Base class of every error raised by django-taskclaim."""


class InvalidTaskKey(TaskClaimError, ValueError):
    """A key or tenant is not a usable identity (type, length or characters)."""


class InvalidLease(TaskClaimError, ValueError):
    """A lease is not a number of seconds or a ``timedelta`` between 0.1 s and ``TASKCLAIM_MAX_LEASE``."""


class InvalidPayload(TaskClaimError, ValueError):
    """A payload cannot be stored as JSON (not serialisable, a NUL or lone surrogate, too large)."""


class InvalidResult(TaskClaimError, ValueError):
    """A result cannot be stored: not JSON-serialisable, a NUL or lone surrogate, or larger than the limit.

    ``run_once`` and the Celery bridge then end the task FAILED, so the work never runs again.
    """


class InvalidArgument(TaskClaimError, ValueError):
    """Another argument the database could not store: an owner or delivery id that is too long or
    holds a NUL, an integer out of its column's range."""


class DatabaseUnreachable(TaskClaimError, OperationalError):
    """A task database could not be reached, or did not answer in time (a server stopped, hung or
    failing over). The message names its alias once; the driver's error, if any, is the cause.
    An ``OperationalError`` too, so that code waiting out a database that is down treats it alike."""

    def __init__(self, alias: str, reason: str) -> None:
        super().__init__(f"task database {alias!r} {reason}")
        self.alias, self.reason = alias, reason
        self.taskclaim_alias = alias  # names its database already (outages.describe)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.alias, self.reason)


class WorkerLost(TaskClaimError):
    """An attempt's worker stopped (killed, paused, cut off) and its lease ran out: the task was
    taken over, or ended FAILED on its last attempt. Never raised: named in a Django task's
    result as the error of such an attempt."""


class CommitUnconfirmed(TaskClaimError, OperationalError):
    """A claim's commit, or a ``fenced()`` block's, was cancelled while it waited for the synchronous
    standby (PostgreSQL's warning "canceling wait for synchronous replication"): it is done on the
    primary, but the standby may lack it, and a failover would lose it. Not confirmed, so not
    trusted: a claim raises this instead of returning (the body does not run; the claim's lease runs
    out, or a failover forgets it), and ``fenced()`` raises it after its commit (the caller's body
    stops there; what it wrote may be lost). An ``OperationalError`` too: a worker treats it as the
    database's trouble it is (its standby gone), as it treats an outage, and polls again."""


class TimedOut(TaskClaimError):
    """An attempt ran past its timeout (``OPTIONS["TIMEOUT"]``, ``@claim_options(timeout=...)``, a
    handler worker's ``--timeout``): its claim was fenced off at that moment (nothing the body writes
    in ``fenced()`` afterwards commits) and the attempt recorded with this error; the task is retried
    or failed by its policy. Never raised into the body: a sync body runs on until it returns."""


class TaskCancelled(TaskClaimError):
    """The task was cancelled (an operator's ``cancel``) before it ended. Never raised: named in
    a Django task's result as its last error, since the framework has no cancelled state."""


class InvalidTransition(TaskClaimError):
    """An operator's cancel or retry of a task in a state it does not apply to: a finished task
    cancelled, a task retried that neither failed nor was cancelled. Nothing was written."""


class _Rebuildable(TaskClaimError):
    """An error with structured fields that can also be rebuilt from its message alone.

    Result backends (Celery's JSON serializer) recreate an exception as ``cls(message)``;
    pickle uses ``__reduce__``. Both must work, or the worker's error is lost in transit.
    """

    _fields: tuple[str, ...] = ()

    def _from_message(self, args: tuple[Any, ...]) -> bool:
        if len(args) == 1 and isinstance(args[0], str):
            for name in self._fields:
                setattr(self, name, None)
            TaskClaimError.__init__(self, args[0])
            return True
        return False

    def __reduce__(self) -> tuple[Any, ...]:
        if getattr(self, self._fields[0], None) is None:
            return (type(self), (str(self),))
        return (type(self), tuple(getattr(self, name) for name in self._fields))


class PayloadMismatch(_Rebuildable):
    """The same ``(tenant, key)`` arrived with a payload that differs from the stored one.

    Like an idempotency key reused with a different request body: it is a client error,
    never a duplicate delivery.
    """

    _fields = ("key", "tenant", "stored_fingerprint", "given_fingerprint")

    def __init__(self, *args: Any) -> None:
        if self._from_message(args):
            return
        key, tenant, stored, given = args
        self.key, self.tenant = key, tenant
        self.stored_fingerprint, self.given_fingerprint = stored, given
        super().__init__(
            f"task {key!r} (tenant {tenant!r}) already exists with a different payload "
            f"(stored fingerprint {stored[:12]}…, given {given[:12]}…); use a new key for new input"
        )


class StaleClaim(_Rebuildable):
    """The claim no longer owns its task: its lease was taken over, or the task moved on.

    Nothing was written. The worker holding this claim should stop its work.
    """

    _fields = ("key", "tenant", "token", "action")

    def __init__(self, *args: Any) -> None:
        if self._from_message(args):
            return
        key, tenant, token, action = args
        self.key, self.tenant, self.token, self.action = key, tenant, token, action
        super().__init__(
            f"{action} refused: claim with token {token} on task {key!r} (tenant {tenant!r}) "
            "was fenced off (the task was taken over, released, reclaimed or finished)"
        )


class TaskBusy(_Rebuildable):
    """Another worker holds a live claim on the task."""

    _fields = ("task",)

    def __init__(self, task: Any) -> None:
        if self._from_message((task,)):
            return
        self.task = task
        super().__init__(
            f"task {task.key!r} (tenant {task.tenant!r}) is running under owner {task.owner!r} "
            f"(token {task.fencing_token})"
        )


class TaskFailed(_Rebuildable):
    """The task ended FAILED or CANCELLED; it is not run again until an operator resets it."""

    _fields = ("task",)

    def __init__(self, task: Any) -> None:
        if self._from_message((task,)):
            return
        self.task = task
        super().__init__(
            f"task {task.key!r} (tenant {task.tenant!r}) is {task.status}"
            + (f": {task.error}" if task.error else "")
        )
