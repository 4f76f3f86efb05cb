"""The task table, its audit trail, and ``Task.objects``: queries, operator actions and the
claim API (which calls the lifecycle; the lifecycle never imports this module)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from asgiref.sync import sync_to_async
from django.db import connections, models
from django.db.models import Count, F, Max, Min, Q
from django.db.models.functions import Coalesce
from django.db.models.lookups import Exact
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from . import routing
from .compat import check_constraint
from .conf import settings
from .identity import resolve_identity
from .lifecycle import api, transitions
from .lifecycle.api import ClaimOutcome
from .lifecycle.claim import Claim
from .status import TERMINAL, MessageStatus, Outcome, Status
from .store import DbNow, DbNowPlus, get_store
from .store.epochs import TOKENS_PER_EPOCH
from .values import MAX_GROUP_LENGTH, canonical_json

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from .identity import TaskKey
    from .store.rows import TaskRow


# A pending task is due when its "not before" time has come by the database clock.
_DUE = Q(run_after__isnull=True) | Q(run_after__lte=DbNow())


class TaskQuerySet(models.QuerySet["Task"]):
    """Filters by state (the lease by the database clock), and the operator actions."""

    def pending(self) -> TaskQuerySet:
        return self.filter(status=Status.PENDING)

    def running(self) -> TaskQuerySet:
        return self.filter(status=Status.RUNNING)

    def expired(self) -> TaskQuerySet:
        """Running tasks whose lease has expired by the database clock, held or not (see :meth:`held`)."""
        return self.filter(status=Status.RUNNING, lease_expires_at__lt=DbNow())

    def held(self) -> TaskQuerySet:
        """Expired tasks whose row an open transaction locks now: the owner inside ``fenced()``
        (or a claim not committed yet). No one can take them over or reclaim them until that
        transaction ends, which commits the owner's work or gives the row up.

        The database is asked when this is called (see ``held_ids``); SQLite has no row locks
        and reports none.
        """
        return self.expired().filter(pk__in=held_ids(self.db, self.expired().values_list("pk", flat=True)))

    def reclaimable(self) -> TaskQuerySet:
        """Expired tasks that no transaction holds: what ``taskclaim_reclaim`` (or a takeover)
        would take now. The database is asked when this is called, as for :meth:`held`."""
        return self.expired().exclude(pk__in=held_ids(self.db, self.expired().values_list("pk", flat=True)))

    def live(self) -> TaskQuerySet:
        """Running tasks whose lease has not expired by the database clock."""
        return self.filter(status=Status.RUNNING, lease_expires_at__gte=DbNow())

    def succeeded(self) -> TaskQuerySet:
        return self.filter(status=Status.SUCCEEDED)

    def failed(self) -> TaskQuerySet:
        return self.filter(status=Status.FAILED)

    def finished(self) -> TaskQuerySet:
        """Terminal tasks: succeeded, failed or cancelled."""
        return self.filter(status__in=TERMINAL)

    def unfinished(self) -> TaskQuerySet:
        return self.exclude(status__in=TERMINAL)

    def queued(self, queues: str | Sequence[str] | None = None, path: str | None = None) -> TaskQuerySet:
        """Queued work (never a task claimed by key): of ``queues`` when given, and with
        ``path`` ``""`` work for a handler, ``"*"`` tasks that name the callable that runs them."""
        found = self.filter(queue__isnull=False)
        if queues is not None:
            found = found.filter(queue__in=[queues] if isinstance(queues, str) else list(queues))
        if path == "":
            found = found.filter(task_path="")
        elif path == "*":
            found = found.exclude(task_path="")
        elif path is not None:
            found = found.filter(task_path=path)
        return found

    def due(self) -> TaskQuerySet:
        """Pending tasks whose "not before" time has come, by the database clock."""
        return self.filter(_DUE, status=Status.PENDING)

    def idle_for(self, seconds: float) -> TaskQuerySet:
        """Tasks whose row has not changed for more than ``seconds``, by the database clock (the
        clock that writes ``updated_at``: a caller's own clock may be off)."""
        return self.filter(updated_at__lt=DbNowPlus(-seconds))

    def queue_stats(self) -> list[dict[str, Any]]:
        """Per queue, what operators alert on: ``due`` (pending, runnable now), ``deferred``
        (pending, not before a later time), ``running``, and ``oldest_due_age``, the seconds the
        oldest due task has waited since it became due, by the database clock (``None`` when
        none is due). One query; finished tasks and tasks claimed by key are not counted."""
        pending, running = Q(status=Status.PENDING), Q(status=Status.RUNNING)
        rows = (self.queued().filter(status__in=(Status.PENDING, Status.RUNNING)).order_by("queue")
                .values("queue").annotate(
                    due=Count("pk", filter=pending & _DUE), deferred=Count("pk", filter=pending & ~_DUE),
                    running=Count("pk", filter=running), db_now=Max(DbNow()),
                    oldest_due=Min(Coalesce("run_after", "created_at"), filter=pending & _DUE)))
        return [{"queue": r["queue"], "due": r["due"], "deferred": r["deferred"], "running": r["running"],
                 "oldest_due_age": None if r["oldest_due"] is None
                 else max(0.0, (r["db_now"] - r["oldest_due"]).total_seconds())} for r in rows]

    # -- operator actions: the lifecycle's guarded transitions, fencing as for workers --------
    def force_release(self) -> int:
        """Running tasks back to PENDING now, as their owner's release would (the attempt does
        not count); the owners are fenced off from then on."""
        held = list(self.running().values_list("pk", "fencing_token"))
        return len(transitions.force_release(self.db, held))

    def reset(self) -> int:
        """FAILED or CANCELLED tasks back to PENDING with their attempts count at zero."""
        return transitions.reset(self.db, list(self.filter(status__in=(Status.FAILED, Status.CANCELLED))
                                               .values_list("pk", flat=True)))

    def cancel(self) -> int:
        """Unfinished tasks to CANCELLED; a running owner is fenced off."""
        return transitions.cancel(self.db, list(self.unfinished().values_list("pk", flat=True)))


#: Why a held task is neither reclaimed nor taken over, in the words every operator view uses.
HELD_REASON = "its row is locked by an open transaction (the owner inside fenced(), or a claim not committed yet)"


def held_ids(using: str, ids: Iterable[int]) -> set[int]:
    """Of the tasks ``ids`` on database ``using``, those whose row an open transaction locks now.

    The store's probe: it waits for no lock and keeps none. Rows the caller's own transaction
    locked count as free on PostgreSQL; on MySQL/MariaDB, asked from inside a transaction, the
    probe runs on a connection of its own, where such rows count as held once committed (rows
    the transaction inserted are not seen there, and count as free).
    """
    wanted = list(ids)
    if not wanted:
        return set()
    with connections[using].cursor() as cursor:
        return set(get_store(using).held(cursor, wanted))


_QueryManager = models.Manager.from_queryset(TaskQuerySet)


class TaskManager(_QueryManager["Task"]):
    """The queryset's filters and actions on ``TASKCLAIM_DATABASE``, and the claim API.

    With tenants routed over several databases (``TASKCLAIM_ROUTER``), the claim API goes to each
    tenant's database, the queries to ``TASKCLAIM_DATABASE``: ``for_tenant(tenant)`` (or
    ``db_manager(alias)``) reaches another one, ``databases()`` lists them all.
    """

    def get_queryset(self) -> TaskQuerySet:
        return TaskQuerySet(self.model, using=self._db or settings.DATABASE)

    def _using(self) -> str | None:
        """The alias this manager was bound to (``db_manager``); ``None``: route by tenant."""
        return self._db

    def for_tenant(self, tenant: str) -> TaskManager:
        """This manager on the database that holds ``tenant``'s tasks (``TASKCLAIM_ROUTER``)."""
        _, tenant = resolve_identity("-", tenant)
        return self.db_manager(routing.route(tenant))

    @staticmethod
    def databases() -> tuple[str, ...]:
        """Every task database, in the order of ``TASKCLAIM_DATABASES``."""
        return routing.databases()

    def ensure(self, key: str | TaskKey, tenant: str = "", payload: Any = None,
               max_attempts: int | None = None, **options: Any) -> Task:
        """Create the task PENDING if absent; see :func:`django_taskclaim.claims.ensure`."""
        return api.ensure(key, tenant, payload, max_attempts, using=self._using(), **options)

    def claim(self, key: str | TaskKey, tenant: str = "", owner: str | None = None,
              lease: float | timedelta | None = None, payload: Any = None, **options: Any) -> ClaimOutcome:
        """Claim one task by key; see :func:`django_taskclaim.claims.claim`."""
        return api.claim(key, tenant, owner, lease, payload, using=self._using(), **options)

    def claim_next(self, owner: str | None = None, lease: float | timedelta | None = None,
                   tenant: str | None = None, limit: int = 1, **options: Any) -> list[Claim]:
        """Claim the next tasks, queue style; see :func:`django_taskclaim.claims.claim_next`."""
        return api.claim_next(owner, lease, tenant, limit, using=self._using(), **options)

    def reclaim_expired(self, limit: int | None = None) -> int:
        """Expired RUNNING tasks to PENDING (FAILED when attempts are spent); how many moved.
        Of every task database, unless this manager is bound to one (``db_manager``)."""
        return api.reclaim_expired(limit, using=self._using())

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


class Task(models.Model):
    """One logical unit of work, identified by ``(tenant, key)``, claimed by one worker at a time."""

    Status = Status
    TERMINAL = TERMINAL

    id = models.BigAutoField(primary_key=True)
    tenant = models.CharField(_("tenant"), max_length=255, blank=True, default="")
    key = models.CharField(_("key"), max_length=255)
    status = models.CharField(_("status"), max_length=16, choices=Status.choices, default=Status.PENDING)
    owner = models.CharField(_("owner"), max_length=255, blank=True, default="")
    fencing_token = models.BigIntegerField(_("fencing token"), default=0)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    max_attempts = models.PositiveIntegerField(_("max attempts"), default=5)
    # Changes on every heartbeat: deliberately in no index, so renewals stay HOT updates.
    lease_expires_at = models.DateTimeField(_("lease expires at"), null=True, blank=True)
    payload = models.JSONField(_("payload"), null=True, blank=True)
    payload_fingerprint = models.CharField(_("payload fingerprint"), max_length=64, blank=True, default="")
    result = models.JSONField(_("result"), null=True, blank=True)
    result_ref = models.CharField(_("result reference"), max_length=1024, blank=True, default="")
    error = models.TextField(_("error"), blank=True, default="")
    # What the Celery bridge needs to publish the task again (name, args, kwargs, options), or
    # which Django task backend enqueued it.
    dispatch = models.JSONField(_("dispatch"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    updated_at = models.DateTimeField(_("updated at"), default=timezone.now)
    # Queued work: the queue claim_next() hands it out from (NULL: claimed by key only, as
    # run_once, the Celery bridge and LangGraph nodes claim), the highest priority first,
    # not before run_after, run by the callable at task_path ('' for a worker's handler).
    queue = models.CharField(_("queue"), max_length=100, null=True, blank=True, default=None)  # noqa: DJ001
    priority = models.SmallIntegerField(_("priority"), default=0)
    run_after = models.DateTimeField(_("not before"), null=True, blank=True)
    task_path = models.CharField(_("task path"), max_length=255, blank=True, default="")
    # Concurrency limits: at most concurrency_limit tasks of one concurrency_key RUNNING at once
    # in this database ('' and NULL: no limit); the queue claim decides it (docs/django-tasks.md).
    concurrency_key = models.CharField(_("concurrency key"), max_length=255, blank=True, default="")
    concurrency_limit = models.PositiveIntegerField(_("concurrency limit"), null=True, blank=True)
    # Progress: what the latest claim wrote with ``claim.progress()`` (a fraction in [0, 1] and a
    # note), and that claim's fencing token. Kept when the task is claimed again (the claim
    # statements do not touch it): a progress_token below the fencing token is an earlier
    # attempt's. Nullable, so adding them is instant and the stores' inserts need not name them.
    progress = models.FloatField(_("progress"), null=True, blank=True)
    progress_note = models.CharField(_("progress note"), max_length=255, null=True, blank=True)  # noqa: DJ001
    progress_token = models.BigIntegerField(_("progress written by token"), null=True, blank=True)

    objects = TaskManager()

    class Meta:
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        ordering = ["-id"]
        permissions = [
            ("reclaim_task", "Can reclaim expired tasks"),
            ("release_task", "Can force-release a running task"),
            ("reset_task", "Can reset a failed or cancelled task"),
            ("cancel_task", "Can cancel a task"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key"], name="taskclaim_task_tenant_key_uniq"),
            check_constraint(
                name="taskclaim_task_status_valid",
                condition=Q(status__in=Status.values),
            ),
            check_constraint(name="taskclaim_task_token_nonnegative", condition=Q(fencing_token__gte=0)),
            # A claim past the last token of its epoch would wrap into the next epoch's first
            # (store/epochs.py): refused, naming this constraint. Never-claimed tasks keep token 0.
            check_constraint(name="taskclaim_task_token_within_its_epoch",
                             condition=Q(fencing_token=0) | ~Q(Exact(F("fencing_token").bitand(TOKENS_PER_EPOCH), 0))),
            check_constraint(
                name="taskclaim_task_running_has_lease",
                condition=~Q(status=Status.RUNNING) | Q(lease_expires_at__isnull=False),
            ),
        ]
        indexes = [
            # Match the queue claim: a queue's pending tasks, the highest priority first, then the
            # oldest (finished and by-key tasks are in no entry); and expired running ones.
            models.Index(fields=["queue", "-priority", "id"], condition=Q(status=Status.PENDING, queue__isnull=False),
                         name="taskclaim_task_queued_idx"),
            models.Index(fields=["id"], condition=Q(status=Status.RUNNING), name="taskclaim_task_running_idx"),
            # The queue claim counts a limited key's running tasks and its pending ones ahead.
            models.Index(fields=["concurrency_key", "status"], name="taskclaim_task_limit_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.key}" if self.tenant else self.key

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

    @classmethod
    def from_row(cls, row: TaskRow, using: str) -> Task:
        """The ``Task`` of a row the claim API returned (``ensure_many``), as loaded from ``using``."""
        return cast("Task", transitions.to_task(row, using))

    def requeue(self, dispatch: dict[str, Any], *, token: int | None = None, older_than: float | None = None) -> bool:
        """Record that this pending task's lost message is about to be sent again (``dispatch``, its
        new message record): whether it was recorded. It is, if the task is still PENDING with
        ``token`` (the token it was reclaimed with), or, without a token, unchanged for
        ``older_than`` seconds; a guarded write, so two sweepers never send one task twice."""
        return transitions.requeue(self._state.db or settings.DATABASE, self.pk, canonical_json(dispatch, "dispatch"),
                                   token=token, older_than=older_than)

    def lease_remaining(self, now: datetime | None = None) -> float | None:
        """Seconds of lease left (negative once expired), by ``now`` or the local clock; display only."""
        if self.status != self.Status.RUNNING or self.lease_expires_at is None:
            return None
        return (self.lease_expires_at - (now or timezone.now())).total_seconds()


class Attempt(models.Model):
    """One claim of a task (or one delivery that found it taken): the audit trail."""

    Outcome = Outcome

    id = models.BigAutoField(primary_key=True)
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="attempt_set", verbose_name=_("task"))
    # NULL for duplicate deliveries, which never held a claim.
    token = models.BigIntegerField(_("fencing token"), null=True, blank=True)
    owner = models.CharField(_("owner"), max_length=255, blank=True, default="")
    delivery_id = models.CharField(_("delivery id"), max_length=255, blank=True, default="")
    started_at = models.DateTimeField(_("started at"), default=timezone.now)
    ended_at = models.DateTimeField(_("ended at"), null=True, blank=True)
    outcome = models.CharField(_("outcome"), max_length=16, choices=Outcome.choices, default=Outcome.RUNNING)
    stale_writes = models.PositiveIntegerField(_("fenced-off writes"), default=0)
    # Why this attempt failed, kept with it (the task's own error is the latest one's).
    error = models.TextField(_("error"), blank=True, default="")
    error_class = models.CharField(_("error class"), max_length=255, blank=True, default="")
    traceback = models.TextField(_("traceback"), blank=True, default="")

    objects = AttemptManager()

    class Meta:
        verbose_name = _("attempt")
        verbose_name_plural = _("attempts")
        ordering = ["task_id", "started_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["task", "token"], name="taskclaim_attempt_task_token_uniq"),
        ]
        indexes = [models.Index(fields=["started_at"], name="taskclaim_attempt_started_idx")]

    def __str__(self) -> str:
        return f"{self.task_id}#{self.token} {self.outcome}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "owner": self.owner,
            "delivery_id": self.delivery_id,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "outcome": self.outcome,
            "stale_writes": self.stale_writes,
        }


class CoalesceGroup(models.Model):
    """A coalescing group of Django tasks (``@coalesced``) and its latest task: the row an enqueue of
    the group locks, so that deciding "this waiting task, or a new one" is atomic across processes.

    ``task_id`` is a plain number, not a foreign key: the task may be purged (with a raw ``DELETE``)
    while the group lives on, and a group whose task is gone, ended or started gets a new one.
    """

    id = models.BigAutoField(primary_key=True)
    tenant = models.CharField(_("tenant"), max_length=255, blank=True, default="")
    name = models.CharField(_("group"), max_length=MAX_GROUP_LENGTH)
    task_id = models.BigIntegerField(_("latest task"), null=True, blank=True)

    class Meta:
        verbose_name = _("coalescing group")
        verbose_name_plural = _("coalescing groups")
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="taskclaim_group_tenant_name_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.name}" if self.tenant else self.name


class OutboxQuerySet(models.QuerySet["OutboxMessage"]):
    """The outbox's figures for operators."""

    def stats(self) -> dict[str, Any]:
        """Messages by status (``pending``, ``delivered``, ``failed``) and ``oldest_pending_age``:
        the seconds the oldest pending message has waited since it was recorded, by the database
        clock (``None`` with none pending). One query."""
        pending = Q(status=MessageStatus.PENDING)
        found = self.order_by().aggregate(
            **{status: Count("pk", filter=Q(status=status)) for status in MessageStatus.values},
            db_now=Max(DbNow()), oldest=Min("created_at", filter=pending))
        oldest, db_now = found.pop("oldest"), found.pop("db_now")
        found["oldest_pending_age"] = None if oldest is None else max(0.0, (db_now - oldest).total_seconds())
        return found


class OutboxMessage(models.Model):
    """An outgoing HTTP request recorded by ``claim.outbox.http()`` inside ``fenced()``, in the same
    transaction as the completion; delivered afterwards by ``manage.py taskclaim_relay``.

    The relay claims a message as a worker claims a task: a lease and a token of its own
    (``relay_token``), and every record of an answer conditioned on that token.
    """

    Status = MessageStatus

    id = models.BigAutoField(primary_key=True)
    # The task whose claim recorded it, and that claim's fencing token (sent downstream).
    tenant = models.CharField(_("tenant"), max_length=255, blank=True, default="")
    task_key = models.CharField(_("task key"), max_length=255)
    token = models.BigIntegerField(_("fencing token"))
    effect = models.CharField(_("effect"), max_length=255, blank=True, default="")
    idempotency_key = models.CharField(_("idempotency key"), max_length=68)
    method = models.CharField(_("method"), max_length=8)
    url = models.CharField(_("URL"), max_length=2048)
    body = models.JSONField(_("JSON body"), null=True, blank=True)
    # The message's own headers (authentication: ``outbox.http(headers=...)``), sent with the
    # contract's; emptied once delivered, never logged nor shown in the admin.
    headers = models.JSONField(_("headers"), default=dict, blank=True)
    status = models.CharField(_("status"), max_length=16, choices=MessageStatus.choices,
                              default=MessageStatus.PENDING)
    # Deliveries started (counted when a relay claims it, so a message that kills its relays ends).
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    # Not before this time by the database clock (NULL: at once); moved on by a retry's backoff.
    next_try_at = models.DateTimeField(_("next try"), null=True, blank=True)
    answer_status = models.PositiveIntegerField(_("last answer's status code"), null=True, blank=True)
    answer_excerpt = models.TextField(_("last answer (excerpt)"), blank=True, default="")
    # The relay's claim: who delivers it now, until when, with which token.
    relay_owner = models.CharField(_("relay"), max_length=255, blank=True, default="")
    relay_token = models.BigIntegerField(_("relay token"), default=0)
    lease_expires_at = models.DateTimeField(_("relay lease expires at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    delivered_at = models.DateTimeField(_("answered at"), null=True, blank=True)

    objects = OutboxQuerySet.as_manager()

    class Meta:
        verbose_name = _("outbox message")
        verbose_name_plural = _("outbox messages")
        ordering = ["-id"]
        constraints = [
            check_constraint(name="taskclaim_outbox_status_valid", condition=Q(status__in=MessageStatus.values)),
        ]
        indexes = [
            # Match the relay's claim: pending messages, the oldest first.
            models.Index(fields=["id"], condition=Q(status=MessageStatus.PENDING), name="taskclaim_outbox_pending_idx"),
            models.Index(fields=["idempotency_key"], name="taskclaim_outbox_idem_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.method} {self.url[:80]} ({self.status})"


class ConcurrencyGate(models.Model):
    """A concurrency key's gate: the row each queue claim that starts a pending task of the key
    bumps (``version``), in the claim's own transaction. A claim takes the gate's row lock, then
    counts the key's running tasks again, in a snapshot taken after the lock (PostgreSQL's
    ``taskclaim_fit()``) or by a READ COMMITTED read (MySQL): two claims can never both fill the
    last slot. SQLite's one writer needs no gate.
    """

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(_("concurrency key"), max_length=255, unique=True)
    version = models.BigIntegerField(_("version"), default=0)

    class Meta:
        verbose_name = _("concurrency gate")
        verbose_name_plural = _("concurrency gates")

    def __str__(self) -> str:
        return f"{self.key} @{self.version}"


class Epoch(models.Model):
    """The store's bumpable epoch (one row, id 1): ``manage.py taskclaim_epoch --bump`` raises it after
    a promotion, and every claim's token is above every token of an earlier epoch. On PostgreSQL the
    server's timeline leads and ``bumps`` count within ``timeline`` (a bump of an older timeline no
    longer counts); elsewhere ``timeline`` stays 0 and ``bumps`` is the epoch
    (``django_taskclaim.store.epochs`` holds the layout and its bounds).
    """

    id = models.SmallIntegerField(primary_key=True)
    timeline = models.BigIntegerField(_("timeline"), default=0)
    bumps = models.BigIntegerField(_("bumps"), default=0)
    bumped_at = models.DateTimeField(_("bumped at"), null=True, blank=True)

    class Meta:
        verbose_name = _("epoch")
        verbose_name_plural = _("epochs")

    def __str__(self) -> str:
        return f"timeline {self.timeline}, bumps {self.bumps}"

class StepManager(models.Manager["Step"]):
    """``Step.objects``: a task's stored steps, on the database that holds the task table (as
    :class:`AttemptManager`)."""

    def get_queryset(self) -> models.QuerySet[Step]:
        return super().get_queryset().using(self._db or settings.DATABASE)


class Step(models.Model):
    """A durable step's stored result (``claim.step(name, fn)``): written once, by a fenced write of
    the claim that ran it (``token``), and read by every later attempt of the task instead of
    calling ``fn`` again. Deleted with its task (the purge deletes it first)."""

    id = models.BigAutoField(primary_key=True)
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="step_set", verbose_name=_("task"))
    name = models.CharField(_("name"), max_length=255)
    # The JSON the step's function returned, as TASKCLAIM_JSON_ENCODER wrote it ('null' for None).
    result = models.JSONField(_("result"), null=True, blank=True)
    # The fencing token of the claim that stored it: which attempt ran the step.
    token = models.BigIntegerField(_("fencing token"))
    created_at = models.DateTimeField(_("stored at"), default=timezone.now)

    objects = StepManager()

    class Meta:
        verbose_name = _("step")
        verbose_name_plural = _("steps")
        ordering = ["task_id", "id"]
        constraints = [
            models.UniqueConstraint(fields=["task", "name"], name="taskclaim_step_task_name_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id}:{self.name}"
