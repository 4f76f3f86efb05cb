"""``TaskQuerySet`` (states as names) and ``TaskManager`` (the claim API)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import connections, models, transaction

from .backends import DbNow, get_backend
from .conf import settings

if TYPE_CHECKING:
    from .claims import Claim, ClaimOutcome
    from .keys import TaskKey
    from .models import Attempt, Task

TERMINAL = ("succeeded", "failed", "cancelled")


@contextmanager
def write_transaction(using: str) -> Iterator[None]:
    """``transaction.atomic`` whose first statement takes the write lock (SQLite).

    For operator actions that read the rows they then change: on SQLite a transaction that
    reads first fails at once with "database is locked" beside busy workers instead of
    waiting for the busy timeout.
    """
    with transaction.atomic(using=using):
        with connections[using].cursor() as cursor:
            get_backend(using).begin_write(cursor)
        yield


class TaskQuerySet(models.QuerySet["Task"]):
    def pending(self) -> TaskQuerySet:
        return self.filter(status="pending")

    def running(self) -> TaskQuerySet:
        return self.filter(status="running")

    def expired(self) -> TaskQuerySet:
        """Running tasks whose lease has expired by the database clock."""
        return self.filter(status="running", lease_expires_at__lt=DbNow())

    def live(self) -> TaskQuerySet:
        """Running tasks whose lease has not expired by the database clock."""
        return self.filter(status="running", lease_expires_at__gte=DbNow())

    def succeeded(self) -> TaskQuerySet:
        return self.filter(status="succeeded")

    def failed(self) -> TaskQuerySet:
        return self.filter(status="failed")

    def finished(self) -> TaskQuerySet:
        """Terminal tasks: succeeded, failed or cancelled."""
        return self.filter(status__in=TERMINAL)

    def unfinished(self) -> TaskQuerySet:
        return self.exclude(status__in=TERMINAL)

    # -- operator actions: guarded updates, the same fencing rules as the workers ------------
    def force_release(self) -> int:
        """Running tasks back to PENDING now; their current owners are fenced off from then on."""
        from . import signals
        from .claims import _send
        from .models import Attempt

        alias = self.db
        rows = list(self.filter(status="running").values_list("pk", "fencing_token", "key", "tenant"))
        released = []
        with write_transaction(alias):
            for pk, token, key, tenant in rows:
                n = type(self)(self.model, using=alias).filter(
                    pk=pk, status="running", fencing_token=token
                ).update(status="pending", owner="", lease_expires_at=None, updated_at=DbNow())
                if n:
                    Attempt.objects.using(alias).filter(task_id=pk, token=token, outcome="running").update(
                        outcome="released", ended_at=DbNow())
                    released.append((key, tenant))
        for key, tenant in released:
            _send(alias, signals.task_released, claim=None, key=key, tenant=tenant)
        return len(released)

    def reset(self) -> int:
        """FAILED or CANCELLED tasks back to PENDING with their attempts count at zero."""
        return self.filter(status__in=("failed", "cancelled")).update(
            status="pending", attempts=0, owner="", error="", lease_expires_at=None, updated_at=DbNow())

    def cancel(self) -> int:
        """Unfinished tasks to CANCELLED; a running owner is fenced off."""
        from .models import Attempt

        alias = self.db
        with write_transaction(alias):
            ids = list(self.unfinished().values_list("pk", flat=True))
            n = type(self)(self.model, using=alias).filter(pk__in=ids).unfinished().update(
                status="cancelled", lease_expires_at=None, updated_at=DbNow())
            Attempt.objects.using(alias).filter(task_id__in=ids, outcome="running").update(
                outcome="cancelled", ended_at=DbNow())
        return n


class TaskManager(models.Manager["Task"]):
    """``Task.objects``: queries on the configured database, and the claim API."""

    _queryset_class = TaskQuerySet

    def get_queryset(self) -> TaskQuerySet:
        return TaskQuerySet(self.model, using=self._db or settings.DATABASE)

    def _using(self) -> str:
        return self._db or settings.DATABASE

    def pending(self) -> TaskQuerySet:
        return self.get_queryset().pending()

    def running(self) -> TaskQuerySet:
        return self.get_queryset().running()

    def expired(self) -> TaskQuerySet:
        return self.get_queryset().expired()

    def live(self) -> TaskQuerySet:
        return self.get_queryset().live()

    def succeeded(self) -> TaskQuerySet:
        return self.get_queryset().succeeded()

    def failed(self) -> TaskQuerySet:
        return self.get_queryset().failed()

    def finished(self) -> TaskQuerySet:
        return self.get_queryset().finished()

    def unfinished(self) -> TaskQuerySet:
        return self.get_queryset().unfinished()

    def ensure(self, key: str | TaskKey, tenant: str = "", payload: Any = None,
               max_attempts: int | None = None, **options: Any) -> Task:
        """Create the task PENDING if absent; see :func:`django_taskclaim.claims.ensure`."""
        from .claims import ensure

        return ensure(key, tenant, payload, max_attempts, using=self._using(), **options)

    def claim(self, key: str | TaskKey, tenant: str = "", owner: str | None = None,
              lease: float | timedelta | None = None, payload: Any = None, **options: Any) -> ClaimOutcome:
        """Claim one task by key; see :func:`django_taskclaim.claims.claim`."""
        from .claims import claim

        return claim(key, tenant, owner, lease, payload, using=self._using(), **options)

    def claim_next(self, owner: str | None = None, lease: float | timedelta | None = None,
                   tenant: str | None = None, limit: int = 1, **options: Any) -> list[Claim]:
        """Claim the next tasks, queue style; see :func:`django_taskclaim.claims.claim_next`."""
        from .claims import claim_next

        return claim_next(owner, lease, tenant, limit, using=self._using(), **options)

    def reclaim_expired(self, limit: int | None = None) -> int:
        """Expired RUNNING tasks to PENDING (FAILED when attempts are spent); how many moved."""
        from .claims import reclaim_expired

        return reclaim_expired(limit, using=self._using())

    # -- the async API: the sync calls above on Django's ORM thread (asgiref sync_to_async) --
    async def aensure(self, key: str | TaskKey, tenant: str = "", payload: Any = None,
                      max_attempts: int | None = None, **options: Any) -> Task:
        """:meth:`ensure`, awaitable."""
        return await sync_to_async(self.ensure)(key, tenant, payload, max_attempts, **options)

    async def aclaim(self, key: str | TaskKey, tenant: str = "", owner: str | None = None,
                     lease: float | timedelta | None = None, payload: Any = None, **options: Any) -> ClaimOutcome:
        """:meth:`claim`, awaitable: the same ``ClaimOutcome``."""
        return await sync_to_async(self.claim)(key, tenant, owner, lease, payload, **options)

    async def aclaim_next(self, owner: str | None = None, lease: float | timedelta | None = None,
                          tenant: str | None = None, limit: int = 1, **options: Any) -> list[Claim]:
        """:meth:`claim_next`, awaitable."""
        return await sync_to_async(self.claim_next)(owner, lease, tenant, limit, **options)

    async def areclaim_expired(self, limit: int | None = None) -> int:
        """:meth:`reclaim_expired`, awaitable."""
        return await sync_to_async(self.reclaim_expired)(limit)


class AttemptManager(models.Manager["Attempt"]):
    """``Attempt.objects``: the audit trail, on the database that holds the task table.

    Without it, code reading attempts (the audit command, the admin's timeline) would read the
    router's default database while the tasks live in ``TASKCLAIM_DATABASE``.
    """

    def get_queryset(self) -> models.QuerySet[Attempt]:
        return super().get_queryset().using(self._db or settings.DATABASE)
