"""A task row, and its attempt rows, as the framework's ``TaskResult``."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils.dateparse import parse_datetime
from django.utils.module_loading import import_string

from ..conf import settings
from ..ids import parse_task_id, task_id
from ..status import RESULT_STATUS, Outcome, Status
from .compat import InvalidTask, Task, TaskError, TaskResult, TaskResultStatus

if TYPE_CHECKING:
    from ..claims import TaskRow as StoreRow
    from ..models import Attempt
    from ..models import Task as TaskRow

#: ``status.RESULT_STATUS`` (the one mapping) in the framework's own values.
STATUS = {Status(status): TaskResultStatus(word) for status, word in RESULT_STATUS.items()}
#: What the framework is told of an attempt whose worker stopped (its lease ran out).
LOST_ATTEMPT = "django_taskclaim.exceptions.WorkerLost"
#: The last error of a cancelled task, reported FAILED (the framework has no cancelled state).
CANCELLED = "django_taskclaim.exceptions.TaskCancelled"
_LOST = (Outcome.EXPIRED, Outcome.TAKEN_OVER)


def load_task(path: str) -> Any:
    """The framework's ``Task`` object at ``path`` (the decorated name in its module)."""
    found = import_string(path)
    if not isinstance(found, Task):
        raise InvalidTask(f"{path!r} is not a task (decorate it with @task())")
    return found


def task_as_enqueued(row: TaskRow, backend: str) -> Any:
    """The ``Task`` a result carries: the function at the row's path, with the routing the
    row was enqueued with (a retry's later "not before" is not the task's). A function that
    cannot be imported here (gone, or of a newer release) is stood in for by one of the same
    path that raises the import error when called: the result is still read."""
    dispatch = row.dispatch or {}
    run_after = dispatch.get("run_after")
    routing_ = {"priority": row.priority, "queue_name": row.queue, "backend": backend,
                "run_after": parse_datetime(run_after) if run_after else None}
    try:
        return load_task(row.task_path).using(**routing_)
    except ImportError as exc:
        return _missing_task(row.task_path, exc, routing_)


def _missing_task(path: str, error: ImportError, routing_: dict[str, Any]) -> Any:
    """A ``Task`` for ``path`` whose function cannot be imported: calling it raises ``error`` again."""
    module, _, name = path.rpartition(".")
    message = f"task {path!r} cannot be imported here: {error}"

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise ImportError(message)

    missing.__module__, missing.__qualname__, missing.__name__ = module, name, name
    try:
        return Task(func=missing, **routing_)
    except InvalidTask:  # the routing it was enqueued with is not valid any more: the result is still read
        stand_in = object.__new__(Task)
        for field, value in {"func": missing, "takes_context": False, **routing_}.items():
            object.__setattr__(stand_in, field, value)
        return stand_in


def result_id(row: TaskRow) -> str:
    """The id of a task row's result: its primary key, after the alias of its database when the
    tasks are spread over several (``"shard2:42"``, at most 64 characters: check E008)."""
    return format_result_id(row._state.db or settings.DATABASE, row.pk)


def format_result_id(using: str, pk: int) -> str:
    """The result id of task ``pk`` in database ``using`` (see :func:`result_id`)."""
    return task_id(using, pk)


def parse_result_id(value: object) -> tuple[str, int]:
    """The database and primary key a result id names; ``ValueError`` for an id that names none
    (not of :func:`result_id`'s form, or a database that is not a task database).

    A result id is a task id (:func:`django_taskclaim.ids.parse_task_id`): ``alias:pk`` names task
    ``pk`` of task database ``alias``, and a bare ``pk`` names one only where the tasks are in one
    database: among several, each has its own task number ``pk``, and guessing
    TASKCLAIM_DATABASE's would hand back another task's result."""
    return parse_task_id(str(value))


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
    # attempts afresh, and a released attempt never counted.
    counted = [a for a in attempts if a.token is not None and a.outcome != Outcome.RELEASED]
    claims = counted[len(counted) - row.attempts:] if row.attempts < len(counted) else counted
    errors = [TaskError(exception_class_path=a.error_class or LOST_ATTEMPT,
                        traceback=a.traceback or f"{LOST_ATTEMPT}: the worker stopped; its lease ran out\n")
              for a in claims if a.error_class or a.outcome in _LOST]
    if row.status == Status.CANCELLED:
        errors.append(TaskError(exception_class_path=CANCELLED,
                                traceback=f"{CANCELLED}: the task was cancelled before it ended\n"))
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
