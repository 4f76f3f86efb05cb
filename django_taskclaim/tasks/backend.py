"""``ClaimBackend``: Django's Tasks framework on the task table, exactly once per identity.

    TASKS = {"default": {"BACKEND": "django_taskclaim.tasks.ClaimBackend", "QUEUES": ["default"],
                         "OPTIONS": {"LEASE": 60, "MAX_ATTEMPTS": 5, "BACKOFF": {"base": 2}}}}

``enqueue`` inserts a queued task row in the caller's transaction (it commits or rolls back
with the caller's rows: no ``on_commit``); ``manage.py taskclaim_worker --queue default`` runs
them under claims (one owner at a time, leases, fencing, recovery of dead workers, retries
with backoff). A task declared ``@keyed`` is enqueued once per identity.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.core import checks
from django.db import transaction

from .. import routing
from ..conf import settings
from ..exceptions import InvalidArgument, InvalidTransition
from ..identity import resolve_identity
from ..retries import Backoff
from ..status import RESETTABLE, RESULT_STATUS, UNFINISHED
from ..values import lease_seconds, positive_int, timeout_seconds
from .coalescing import Coalescing, coalescing_of, group_for
from .compat import BaseTaskBackend, InvalidTask, TaskResultDoesNotExist, normalize_json, task_enqueued
from .identity import RUN_AGAIN, identity_of, import_grace, options_of, same_call
from .results import new_result, parse_result_id, result_of


class ClaimBackend(BaseTaskBackend):
    """A backend for ``django.tasks`` (Django 6) and the ``django_tasks`` backport (Django 5.2)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    # The framework builds backends at import of every @task module and in check(): nothing
    # here may touch the database or raise for a bad option (check() reports those).

    # -- what the options say ---------------------------------------------------------------
    @property
    def using(self) -> str:
        """The default task database (``TASKCLAIM_DATABASE``); a tenant's tasks go to :meth:`database_for`."""
        return settings.DATABASE

    @staticmethod
    def database_for(tenant: str) -> str:
        """The database holding ``tenant``'s tasks (``TASKCLAIM_ROUTER``)."""
        return routing.route(tenant)

    def lease_for(self, func: Any) -> float:
        """The lease of ``func``'s claims: its ``claim_options``, else ``OPTIONS["LEASE"]``, else the setting."""
        own = None if func is None else options_of(func).lease
        return own if own is not None else lease_seconds(self.options.get("LEASE"))

    def max_attempts_for(self, func: Any) -> int:
        own = options_of(func).max_attempts
        if own is not None:
            return own
        value = self.options.get("MAX_ATTEMPTS")
        return settings.MAX_ATTEMPTS if value is None else positive_int(value, "OPTIONS['MAX_ATTEMPTS']")

    def backoff_for(self, func: Any) -> Backoff:
        own = options_of(func).backoff
        if own is not None:
            return own
        value = self.options.get("BACKOFF")
        return settings.RETRY_BACKOFF if value is None else Backoff.of(value, "OPTIONS['BACKOFF']")

    def timeout_for(self, func: Any) -> float | None:
        """Seconds an attempt of ``func`` may run before its claim is fenced off: its
        ``claim_options(timeout=...)``, else ``OPTIONS["TIMEOUT"]``, else none."""
        own = None if func is None else options_of(func).timeout
        if own is not None:
            return own
        value = self.options.get("TIMEOUT")
        return None if value is None else timeout_seconds(value, "OPTIONS['TIMEOUT']")

    @property
    def import_grace(self) -> float:
        """Seconds after a task's enqueue during which a worker that cannot import it releases it
        uncharged (``OPTIONS["IMPORT_GRACE"]``, default 600); past them it ends FAILED."""
        return import_grace(self.options.get("IMPORT_GRACE"))

    # -- enqueue ----------------------------------------------------------------------------
    def enqueue(self, task: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Insert the task (or find its identity's) and return its result, as ``get_result`` would."""
        from ..claims import ensure_task

        self.validate_task(task)
        coalescing = coalescing_of(task.func)
        if coalescing is not None:
            return self._coalesce(task, coalescing, args, kwargs)
        key, tenant, payload = self._call(task, identity_of(task.func), args, kwargs)
        concurrency_key, concurrency_limit = options_of(task.func).concurrency(args, kwargs) or ("", None)
        row, created = ensure_task(
            key, tenant, payload, self.max_attempts_for(task.func), queue=task.queue_name, priority=task.priority,
            run_after=task.run_after, task_path=task.module_path, dispatch=self._dispatch(task),
            using=self.database_for(tenant), same_payload=same_call(task.func, task.takes_context),
            concurrency_key=concurrency_key, concurrency_limit=concurrency_limit)
        # A new row is the task as enqueued; an identity met again is the task as it was stored.
        if not created:
            return self._met_again(task, row)
        result = result_of(row, [], self.alias, task)
        task_enqueued.send(type(self), task_result=result)
        return result

    def enqueue_tick(self, task: Any, key: str, args: Sequence[Any], kwargs: dict[str, Any], tick: Any) -> Any:
        """Enqueue ``task`` as the tick ``key`` of a schedule, not before ``tick``, unless that key exists:
        its result, or ``None`` where the tick was enqueued already (by any scheduler).

        One statement where the key exists (the tick's task is not read). The task's queue,
        priority, lease and attempts hold as for ``enqueue``; the key is the tick's, whatever
        the task's ``@keyed`` says (a tick is the work's identity).
        """
        from ..claims import insert_new

        self.validate_task(task)
        args, kwargs = normalize_json(args), normalize_json(kwargs)
        row = insert_new(key, "", {"args": args, "kwargs": kwargs}, self.max_attempts_for(task.func),
                         queue=task.queue_name, priority=task.priority, run_after=tick, task_path=task.module_path,
                         dispatch={**self._dispatch(task), "run_after": tick.isoformat()},
                         using=self.database_for(""))
        if row is None:
            return None
        result = result_of(row, [], self.alias, task)
        task_enqueued.send(type(self), task_result=result)
        return result

    def enqueue_many(self, task: Any, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]) -> list[Any]:
        """Enqueue ``task`` once for each ``(args, kwargs)`` of ``calls``: their results, in order, each
        as ``task.enqueue(*args, **kwargs)`` would return it.

        The bulk form of ``enqueue``: one multi-row INSERT per chunk of (up to) 1,000 tasks, all in one
        transaction on the task database (on each, for tenants routed to several), the caller's where
        there is one (the tasks commit or roll back with the caller's rows). Every call is checked
        before anything is written (a bad argument raises the framework's ``TypeError``), and the
        call is all or nothing: a keyed
        task's identity met again (stored before, or earlier in ``calls``) returns that task, and
        with other arguments raises ``PayloadMismatch``, which keeps none of the call's tasks.
        ``task_enqueued`` is sent for each task it created.

            results = ClaimBackend.enqueue_many(send_mail, [((user.pk,), {}) for user in users])
        """
        from ..claims import ensure_many
        from ..models import Task

        self.validate_task(task)
        # Each call joins its group's task, or carries its own concurrency key: one at a time.
        if coalescing_of(task.func) is not None or options_of(task.func).concurrency_limit is not None:
            with transaction.atomic(using=self.database_for("")):
                return [self.enqueue(task, args, dict(kwargs)) for args, kwargs in calls]
        identity = identity_of(task.func)
        # A generator: each call's arguments are encoded as they come, and kept no longer (every
        # call is still checked before the first insert).
        new = (self._call(task, identity, args, kwargs) for args, kwargs in calls)
        with transaction.atomic(using=self.using):
            rows = ensure_many(new, self.max_attempts_for(task.func), queue=task.queue_name, priority=task.priority,
                               run_after=task.run_after, task_path=task.module_path,
                               dispatch=self._dispatch(task), same_payload=same_call(task.func, task.takes_context))
            made = [created for _, created, _ in rows]
            results = [new_result(task, row, self.alias, using=alias) if created
                       else self._met_again(task, Task.from_row(row, alias))
                       for row, created, alias in rows]
            del rows  # thousands of rows: not kept while the receivers run
        sender = type(self)
        for result, created in zip(results, made, strict=True):
            if created:
                task_enqueued.send(sender, task_result=result)
        return results

    def _coalesce(self, task: Any, coalescing: Coalescing, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """``enqueue`` of a ``@coalesced`` task: its group's waiting task, now with these arguments, or a
        new task (see ``coalescing.coalesced``); ``task_enqueued`` is sent for a new task only."""
        from ..claims import coalesce_task

        if task.run_after is not None:
            raise InvalidArgument(f"coalesced task {task.module_path!r}: run_after is not for a coalesced task; "
                                  "its not-before time comes from coalesced(delay=..., max_delay=...)")
        args, kwargs = normalize_json(args), normalize_json(kwargs)
        group = group_for(task, coalescing, args, kwargs)
        # With claim_options(concurrency_key=..., concurrency_limit=...): a group run one at a time.
        concurrency_key, concurrency_limit = options_of(task.func).concurrency(args, kwargs) or ("", None)
        row, created = coalesce_task(
            group, "", {"args": args, "kwargs": kwargs}, self.max_attempts_for(task.func), queue=task.queue_name,
            priority=task.priority, task_path=task.module_path, delay=coalescing.delay, max_delay=coalescing.max_delay,
            dispatch=self._dispatch(task), using=self.database_for(""), concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit)
        # Either way the task never started (a collapse takes only a task no claim took): no attempts to read.
        result = result_of(row, [], self.alias, task)
        if created:
            task_enqueued.send(type(self), task_result=result)
        return result

    @staticmethod
    def _call(task: Any, identity: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Any, str, Any]:
        """``(key, tenant, payload)`` of one call: its declared identity, or a fresh one (every call is new work)."""
        # The framework's JSON rule, before anything is stored: a bad argument raises here.
        args, kwargs = normalize_json(args), normalize_json(kwargs)  # a list and a dict, new
        if identity is not None:
            key, tenant = resolve_identity(identity.of(*args, **kwargs), "")
        else:
            key, tenant = f"task:{secrets.token_hex(16)}", ""  # 128 random bits, as a uuid4's 122
        return key, tenant, {"args": args, "kwargs": kwargs}

    def _dispatch(self, task: Any) -> dict[str, Any]:
        dispatch = {"backend": self.alias}
        if task.run_after is not None:
            dispatch["run_after"] = task.run_after.isoformat()
        return dispatch

    def _met_again(self, task: Any, row: Any) -> Any:
        """The result of an identity met again: the task as it was stored (run again first, under
        ``RUN_AGAIN``, if it FAILED or was CANCELLED). A key of other work (claimed by key, another
        task) was refused by ``ensure_task``/``ensure_many`` (``transitions.refuse_other_work``)."""
        identity = identity_of(task.func)
        if identity is not None and identity.after_failure == RUN_AGAIN and row.status in RESETTABLE:
            type(row).objects.using(row._state.db).filter(pk=row.pk).reset()
            row.refresh_from_db(using=row._state.db)
        return result_of(row, self._attempts(row.pk, row._state.db), self.alias)

    # -- results ----------------------------------------------------------------------------
    def get_result(self, result_id: str) -> Any:
        """The result of the task ``result_id`` names (``results.result_id``); ``TaskResultDoesNotExist``
        for any other id."""
        row = self._row(result_id)
        with routing.reaching(row._state.db):
            return result_of(row, self._attempts(row.pk, row._state.db), self.alias)

    def _row(self, result_id: str) -> Any:
        """The task row ``result_id`` names; ``TaskResultDoesNotExist`` for any other id."""
        from ..models import Task

        try:
            using, pk = parse_result_id(result_id)
        except ValueError as exc:  # an id of no task database (a bare pk among several): it says why
            raise TaskResultDoesNotExist(str(exc)) from None
        try:
            with routing.reaching(using):
                return Task.objects.using(using).exclude(task_path="").get(pk=pk)
        except (ValueError, OverflowError, Task.DoesNotExist):
            raise TaskResultDoesNotExist(result_id) from None

    # -- an operator's cancel and retry: the lifecycle's guarded transitions ------------------
    def cancel(self, result_id: str) -> Any:
        """Cancel the READY or RUNNING task ``result_id`` names (a running worker is fenced off:
        nothing it writes afterwards commits); its result, now FAILED with the error
        ``TaskCancelled``. ``InvalidTransition`` for a task that already ended."""
        return self._operate(result_id, "cancel", UNFINISHED, "only a READY or RUNNING task can be cancelled")

    def retry(self, result_id: str) -> Any:
        """Run the FAILED (or cancelled) task ``result_id`` names again, under the same id: READY,
        its attempts counted afresh (as ``after_failure=RUN_AGAIN`` does); its result.
        ``InvalidTransition`` for a task that did not fail."""
        return self._operate(result_id, "reset", RESETTABLE,
                             "only a FAILED task (failed, or cancelled) can be retried")

    async def acancel(self, result_id: str) -> Any:
        """:meth:`cancel` on Django's ORM thread."""
        return await sync_to_async(self.cancel)(result_id)

    async def aretry(self, result_id: str) -> Any:
        """:meth:`retry` on Django's ORM thread."""
        return await sync_to_async(self.retry)(result_id)

    def _operate(self, result_id: str, action: str, applies_to: tuple[str, ...], rule: str) -> Any:
        row = self._row(result_id)
        using = row._state.db
        # The queryset's operator action: the same guarded statement as the admin's and the
        # commands', which applies only while the task is still in one of ``applies_to``.
        done = getattr(type(row).objects.using(using).filter(pk=row.pk, status__in=applies_to), action)()
        row.refresh_from_db(using=using)
        if not done:
            raise InvalidTransition(f"task {result_id!r} is {RESULT_STATUS[row.status]} ({row.status}): {rule}")
        return result_of(row, self._attempts(row.pk, using), self.alias)

    def _attempts(self, pk: int, using: str | None = None) -> list[Any]:
        from ..models import Attempt

        return list(Attempt.objects.using(using or self.using).filter(task_id=pk).order_by("started_at", "id"))

    # -- checks -----------------------------------------------------------------------------
    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Every option it cannot honour, and a task database that is not the caller's."""
        from .checks import backend_messages

        return [*super().check(**kwargs), *backend_messages(self)]


def enqueue_many(task: Any, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]) -> list[Any]:
    """``task.enqueue(*args, **kwargs)`` for each ``(args, kwargs)`` of ``calls``, in bulk: see
    :meth:`ClaimBackend.enqueue_many` (the task's backend must be a ``ClaimBackend``)."""
    backend = task.get_backend()
    if not isinstance(backend, ClaimBackend):
        raise InvalidTask(f"task {task.module_path!r} runs on backend {task.backend!r} "
                          f"({type(backend).__name__}), not a ClaimBackend: enqueue_many() cannot enqueue it")
    return backend.enqueue_many(task, calls)
