"""``ClaimBackend``: Django's Tasks framework on the task table, exactly once per identity.

    TASKS = {"default": {"BACKEND": "django_taskclaim.tasks.ClaimBackend", "QUEUES": ["default"],
                         "OPTIONS": {"LEASE": 60, "MAX_ATTEMPTS": 5, "BACKOFF": {"base": 2}}}}

``enqueue`` inserts a queued task row in the caller's transaction (it commits or rolls back
with the caller's rows: no ``on_commit``); ``manage.py taskclaim_worker --queue default`` runs
them under claims (one owner at a time, leases, fencing, recovery of dead workers, retries
with backoff). A task declared ``@keyed`` is enqueued once per identity.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.core import checks

from .. import routing
from ..conf import settings
from ..exceptions import InvalidTaskKey
from ..keys import lease_seconds, positive_int, resolve_identity
from ..retries import Backoff
from ..status import RESETTABLE
from .compat import BaseTaskBackend, TaskResultDoesNotExist, normalize_json, task_enqueued
from .identity import RUN_AGAIN, identity_of, options_of
from .results import parse_result_id, result_of


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

    # -- enqueue ----------------------------------------------------------------------------
    def enqueue(self, task: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Insert the task (or find its identity's) and return its result, as ``get_result`` would."""
        from ..lifecycle import ensure_task

        self.validate_task(task)
        # The framework's JSON rule, before anything is stored: a bad argument raises here.
        args, kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        identity = identity_of(task.func)
        if identity is not None:
            key, tenant = resolve_identity(identity.of(*args, **kwargs), "")
        else:
            key, tenant = f"task:{uuid.uuid4().hex}", ""  # every call is new work
        dispatch = {"backend": self.alias}
        if task.run_after is not None:
            dispatch["run_after"] = task.run_after.isoformat()
        row, created = ensure_task(
            key, tenant, {"args": args, "kwargs": kwargs}, self.max_attempts_for(task.func),
            queue=task.queue_name, priority=task.priority, run_after=task.run_after, task_path=task.module_path,
            dispatch=dispatch, using=self.database_for(tenant))
        using = row._state.db
        if not created:
            if row.task_path != task.module_path:
                raise InvalidTaskKey(
                    f"key {key!r} (tenant {tenant!r}) already names other work: "
                    f"{row.task_path or 'a task claimed by key'}, not {task.module_path}")
            if identity is not None and identity.after_failure == RUN_AGAIN and row.status in RESETTABLE:
                type(row).objects.using(using).filter(pk=row.pk).reset()
                row.refresh_from_db(using=using)
        # A new row is the task as enqueued; an identity met again is the task as it was stored.
        result = result_of(row, [] if created else self._attempts(row.pk, using), self.alias,
                           task if created else None)
        if created:
            task_enqueued.send(type(self), task_result=result)
        return result

    # -- results ----------------------------------------------------------------------------
    def get_result(self, result_id: str) -> Any:
        """The result of the task ``result_id`` names (``results.result_id``); ``TaskResultDoesNotExist``
        for any other id."""
        from ..models import Task

        try:
            using, pk = parse_result_id(result_id)
            row = Task.objects.using(using).exclude(task_path="").get(pk=pk)
        except (ValueError, OverflowError, Task.DoesNotExist):
            raise TaskResultDoesNotExist(result_id) from None
        return result_of(row, self._attempts(pk, using), self.alias)

    def _attempts(self, pk: int, using: str | None = None) -> list[Any]:
        from ..models import Attempt

        return list(Attempt.objects.using(using or self.using).filter(task_id=pk).order_by("started_at", "id"))

    # -- checks -----------------------------------------------------------------------------
    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Every option it cannot honour, and a task database that is not the caller's."""
        from .checks import backend_messages

        return [*super().check(**kwargs), *backend_messages(self)]
