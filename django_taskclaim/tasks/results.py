"""A task row, and its attempt rows, as the framework's ``TaskResult``."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils.dateparse import parse_datetime
from django.utils.module_loading import import_string

from .. import routing
from ..conf import settings
from ..status import Outcome, Status
from .compat import InvalidTask, Task, TaskError, TaskResult, TaskResultStatus

if TYPE_CHECKING:
    from ..models import Attempt
    from ..models import Task as TaskRow
    from ..store.rows import TaskRow as StoreRow

STATUS = {
    Status.PENDING: TaskResultStatus.READY,
    Status.RUNNING: TaskResultStatus.RUNNING,
    Status.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    Status.FAILED: TaskResultStatus.FAILED,
    Status.CANCELLED: TaskResultStatus.FAILED,  # the framework has no cancelled state
}
#: What the framework is told of an attempt whose worker stopped (its lease ran out).
LOST_ATTEMPT = "django_taskclaim.exceptions.WorkerLost"
_LOST = (Outcome.EXPIRED, Outcome.TAKEN_OVER)


def load_task(path: str) -> Any:
    """The framework's ``Task`` object at ``path`` (the decorated name in its module)."""
    found = import_string(path)
    if not isinstance(found, Task):
        raise InvalidTask(f"{path!r} is not a task (decorate it with @task())")
    return found


def task_as_enqueued(row: TaskRow, backend: str) -> Any:
    """The ``Task`` a result carries: the function at the row's path, with the routing the
    row was enqueued with (a retry's later "not before" is not the task's)."""
    dispatch = row.dispatch or {}
    run_after = dispatch.get("run_after")
    return load_task(row.task_path).using(
        priority=row.priority, queue_name=row.queue, backend=backend,
        run_after=parse_datetime(run_after) if run_after else None,
    )


def result_id(row: TaskRow) -> str:
    """The id of a task row's result: its primary key, after the alias of its database when the
    tasks are spread over several (``"shard2:42"``, at most 64 characters: check E008)."""
    return format_result_id(row._state.db or settings.DATABASE, row.pk)


def format_result_id(using: str, pk: int) -> str:
    """The result id of task ``pk`` in database ``using`` (see :func:`result_id`)."""
    return f"{using}:{pk}" if routing.several() else str(pk)


def parse_result_id(value: object) -> tuple[str, int]:
    """The database and primary key a result id names; ``ValueError`` for an id that names none
    (not of :func:`result_id`'s form, or a database that is not a task database).

    ``alias:pk`` names task ``pk`` of task database ``alias``. A bare ``pk`` names one only where
    the tasks are in one database: among several, each has its own task number ``pk``, and
    guessing TASKCLAIM_DATABASE's would hand back another task's result."""
    text = str(value)
    alias, colon, pk = text.rpartition(":")
    if not pk.isdigit() or not pk.isascii():
        raise ValueError(f"{text!r} is not a result id")
    if colon and alias not in settings.DATABASES:
        raise ValueError(f"{text!r} names no task database (the result ids of several task databases are "
                         f"'alias:pk', the alias one of {', '.join(map(repr, settings.DATABASES))})")
    if not colon:
        if routing.several():
            raise ValueError(f"{text!r} names no task database: with several task databases a result id is "
                             f"'alias:pk' (the alias one of {', '.join(map(repr, settings.DATABASES))})")
        alias = settings.DATABASE
    return alias, int(pk)


def new_result(task: Any, row: StoreRow, backend: str, owner: str | None = None, *, using: str) -> Any:
    """The ``TaskResult`` of a task row on its first attempt: just enqueued (READY), or just claimed
    by ``owner`` (RUNNING since the claim). What :func:`result_of` makes of such a row, from the
    store's row alone: no model instance, no query (a bulk enqueue builds thousands, a worker one
    a task). ``using`` is the row's database."""
    payload = row.payload or {}
    started = None if owner is None else row.updated_at  # a claim's time
    return TaskResult(
        task=task, id=format_result_id(using, row.id),
        status=TaskResultStatus.READY if owner is None else TaskResultStatus.RUNNING,
        enqueued_at=row.created_at, started_at=started, last_attempted_at=started, finished_at=None,
        args=payload.get("args", []), kwargs=payload.get("kwargs", {}), backend=backend, errors=[],
        worker_ids=[] if owner is None else [owner],
    )


def result_of(row: TaskRow, attempts: Iterable[Attempt], backend: str, task: Any = None) -> Any:
    """The ``TaskResult`` of a task row: its status, times, arguments, errors, workers."""
    # The attempts of this run: a task run again (RUN_AGAIN, an operator's reset) counts its
    # attempts afresh, and a released attempt (given back untouched) never counted.
    counted = [a for a in attempts if a.token is not None and a.outcome != Outcome.RELEASED]
    claims = counted[len(counted) - row.attempts:] if row.attempts < len(counted) else counted
    errors = [TaskError(exception_class_path=a.error_class or LOST_ATTEMPT,
                        traceback=a.traceback or f"{LOST_ATTEMPT}: the worker stopped; its lease ran out\n")
              for a in claims if a.error_class or a.outcome in _LOST]
    payload = row.payload or {}
    status = STATUS[Status(row.status)]
    finished: datetime | None = row.updated_at if row.is_terminal else None
    result: Any = TaskResult(
        task=task if task is not None else task_as_enqueued(row, backend),
        id=result_id(row), status=status, enqueued_at=row.created_at,
        started_at=claims[0].started_at if claims else None,
        last_attempted_at=claims[-1].started_at if claims else None,
        finished_at=finished, args=payload.get("args", []), kwargs=payload.get("kwargs", {}),
        backend=backend, errors=errors, worker_ids=[a.owner for a in claims],
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", row.result)
    return result
