"""Sending work: ``enqueue_once`` (the row in the caller's transaction, the message on commit)
and ``requeue_lost`` (publish again the messages of tasks nobody is going to run)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery import Celery
from celery.result import AsyncResult
from celery.utils import uuid
from django.db import transaction
from django.utils import timezone

from ...claims import Moved, ensure_task
from ...conf import settings
from ...exceptions import InvalidTaskKey
from ...identity import TaskKey, resolve_identity
from ...status import Status
from .app import celery_app
from .options import ClaimOptions

logger = logging.getLogger("django_taskclaim")

#: Default ``manage.py taskclaim_reclaim --requeue-after``: a PENDING task enqueued through the bridge
#: whose message was last sent longer ago than this is considered lost and sent again.
REQUEUE_AFTER = 300.0


@dataclass
class Enqueued:
    """What :func:`enqueue_once` did: scheduled a message, or found the task already there.

    ``created`` is True when this call created the task and will publish on commit (``sent``
    turns True once the message went out; ``error`` holds a publishing failure, which
    ``taskclaim_reclaim --requeue`` repairs). Otherwise ``status`` says what was found.
    """

    task: Any
    created: bool
    celery_id: str  # the id of the Celery message (the ``AsyncResult`` id), not the row's
    sent: bool = False
    error: BaseException | None = None

    @property
    def status(self) -> str:
        """The task's status when ``enqueue_once`` ran: ``pending``, ``running``, ``succeeded``…"""
        return str(self.task.status)

    def result(self, app: Celery | None = None) -> AsyncResult | None:
        """The ``AsyncResult`` of the message for this key (``None`` when no id is known)."""
        if not self.celery_id:
            return None
        return AsyncResult(self.celery_id, app=app or celery_app())


_NOT_STORED = ("eta", "countdown", "expires", "task_id")


def enqueue_once(
    task: Any, *, key: str | TaskKey, tenant: str = "", args: Iterable[Any] = (),
    kwargs: dict[str, Any] | None = None, using: str | None = None, **apply_async_options: Any,
) -> Enqueued:
    """Create the task in the caller's transaction and publish its message when it commits.

    A ``(tenant, key)`` that already exists (pending, running or finished) publishes nothing;
    the returned handle says which state it found. ``key``/``tenant`` must be the ones the
    task computes from ``args``/``kwargs``. What is needed to publish again is stored in
    ``Task.dispatch`` for ``taskclaim_reclaim --requeue``.
    """
    opts: ClaimOptions | None = getattr(task, "taskclaim", None)
    if not isinstance(opts, ClaimOptions):
        raise TypeError(f"enqueue_once needs a task made by claimed_task(), not {task!r}")
    args = list(args)
    kwargs = dict(kwargs or {})
    key, tenant = resolve_identity(key, tenant)
    expected = opts.identity(args, kwargs)
    if expected != (key, tenant):
        raise InvalidTaskKey(
            f"{task.name} computes key {expected[0]!r} (tenant {expected[1]!r}) from these arguments, "
            f"but enqueue_once was given {key!r} (tenant {tenant!r}); they must match"
        )
    task_id = str(apply_async_options.pop("task_id", None) or uuid())
    eta = _eta(apply_async_options)
    dispatch = {
        "task": task.name, "args": args, "kwargs": kwargs, "task_id": task_id,
        "options": {k: v for k, v in apply_async_options.items() if k not in _NOT_STORED},
        "eta": eta.isoformat() if eta else None, "sent": 1,
    }
    row, created = ensure_task(key, tenant, max_attempts=opts.max_attempts, dispatch=dispatch, using=using)
    if not created:
        found = str((row.dispatch or {}).get("task_id", "")) if isinstance(row.dispatch, dict) else ""
        logger.info("enqueue_once: task exists (%s), nothing sent: key=%r tenant=%r", row.status, key, tenant,
                    extra={"key": key, "tenant": tenant, "status": row.status})
        return Enqueued(task=row, created=False, celery_id=found)
    handle = Enqueued(task=row, created=True, celery_id=task_id)

    def publish() -> None:
        try:
            task.apply_async(args=args, kwargs=kwargs, task_id=task_id, **apply_async_options)
        except Exception as exc:  # the row is committed PENDING: taskclaim_reclaim --requeue sends it later
            handle.error = exc
            logger.exception("enqueue_once: publishing failed; taskclaim_reclaim --requeue will send it again: "
                             "key=%r tenant=%r", key, tenant,
                             extra={"key": key, "tenant": tenant, "delivery_id": task_id})
            return
        handle.sent = True

    transaction.on_commit(publish, using=row._state.db)  # the tenant's task database
    return handle


def _eta(options: dict[str, Any]) -> datetime | None:
    if options.get("eta") is not None:
        eta = options["eta"]
        return eta if isinstance(eta, datetime) else None
    if options.get("countdown") is not None:
        return timezone.now() + timedelta(seconds=float(options["countdown"]))
    return None


# -- requeue lost messages ---------------------------------------------------------------------


@dataclass
class Requeued:
    """A task whose message :func:`requeue_lost` sent again (or would, in a dry run)."""

    task_pk: int  # the Task row's primary key
    key: str
    tenant: str
    celery_id: str  # the id of the message sent, as in Enqueued.celery_id
    error: BaseException | None = None


def requeue_lost(
    reclaimed: Iterable[Moved] = (), *, older_than: float | None = REQUEUE_AFTER,
    limit: int | None = None, app: Celery | None = None, using: str | None = None, dry_run: bool = False,
) -> list[Requeued]:
    """Publish again the messages of bridge-enqueued tasks that nobody is going to run.

    - ``reclaimed``: the ``Moved`` rows ``reclaim_expired_rows`` returns; those back in PENDING
      are sent again at once.
    - ``older_than``: PENDING tasks whose message was last sent more than this many seconds
      ago (and whose ETA has passed) are sent again; ``None`` skips this sweep.

    Each re-send first moves ``updated_at`` on in a guarded update, so two sweepers never
    send the same task twice in one round. A duplicate message is harmless anyway: the
    claim turns it into a duplicate delivery.

    ``dry_run``: change and send nothing; return what would be sent (``reclaimed`` may then
    list expired tasks that a reclaim *would* move back to pending).
    """
    from ...models import Task

    using = using or settings.DATABASE
    rows = Task.objects.using(using)
    picked: list[tuple[Any, int | None]] = []  # (task, the token it was reclaimed with)
    status = {} if dry_run else {"status": Status.PENDING}
    for moved in reclaimed:
        if moved.status != Status.PENDING:
            continue
        task = rows.filter(pk=moved.id, fencing_token=moved.token, dispatch__isnull=False, **status).first()
        if task is not None:
            picked.append((task, moved.token))
    if older_than is not None:
        # The database's clock, like updated_at itself: a sweeper's own clock may be off.
        stale = rows.filter(status=Status.PENDING, dispatch__isnull=False).idle_for(older_than).order_by("id")
        seen = {t.pk for t, _ in picked}
        for task in stale[:limit] if limit else stale:
            if task.pk not in seen and not _eta_ahead(task.dispatch):
                picked.append((task, None))
    if limit:
        picked = picked[:limit]
    if dry_run:
        return [Requeued(task.pk, task.key, task.tenant, str(task.dispatch.get("task_id") or ""))
                for task, _ in picked if isinstance(task.dispatch, dict) and task.dispatch.get("task")]
    app = app or celery_app()
    done = []
    for task, token in picked:
        dispatch = dict(task.dispatch) if isinstance(task.dispatch, dict) else {}
        name = dispatch.get("task")
        if not name:
            continue
        dispatch["sent"] = int(dispatch.get("sent", 1)) + 1
        # The guarded write first: two sweepers never send the same task twice in one round.
        if not task.requeue(dispatch, token=token, older_than=None if token is not None else older_than):
            continue  # claimed or re-sent by someone else meanwhile
        item = Requeued(task.pk, task.key, task.tenant, str(dispatch.get("task_id") or ""))
        try:
            _publish(app, name, dispatch)
        except Exception as exc:  # counted and reported by the caller; the next round tries again
            item.error = exc
            logger.exception("requeue failed: key=%r tenant=%r", task.key, task.tenant,
                             extra={"key": task.key, "tenant": task.tenant})
        else:
            logger.info("lost message re-sent: key=%r tenant=%r (message %s)", task.key, task.tenant, item.celery_id,
                        extra={"key": task.key, "tenant": task.tenant, "delivery_id": item.celery_id})
        done.append(item)
    return done


def _eta_ahead(dispatch: Any) -> bool:
    eta = dispatch.get("eta") if isinstance(dispatch, dict) else None
    if not eta:
        return False
    try:
        when = datetime.fromisoformat(eta)
    except ValueError:
        return False
    return when > timezone.now()


def _publish(app: Celery, name: str, dispatch: dict[str, Any]) -> None:
    options = dict(dispatch.get("options") or {})
    task_id = dispatch.get("task_id") or None
    if name in app.tasks:
        app.tasks[name].apply_async(args=dispatch.get("args") or (), kwargs=dispatch.get("kwargs") or {},
                                    task_id=task_id, **options)
    else:
        app.send_task(name, args=dispatch.get("args") or (), kwargs=dispatch.get("kwargs") or {},
                      task_id=task_id, **options)
