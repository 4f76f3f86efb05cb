"""The systems of the Django Tasks phase and how each runs at its best: its interpreter and
packages, its ``TASKS`` backend, its worker command's settings, its bulk enqueue.

Standard library only at import time: the phase's child processes (``benchmarks.tasks_runner``)
import this module under each system's own interpreter, where only that system is installed
(django-ox needs Python 3.12+). What needs Django is imported inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass

OURS, DTDB, OX = "ours", "dtdb", "ox"
QUEUE = "default"


@dataclass(frozen=True)
class Venv:
    """A peer's own virtualenv in the checkout, made on first use (``benchmarks.tasks_venvs``)."""

    folder: str
    python: str  # "3.11": the interpreter version it is made with
    requirements: tuple[str, ...]


@dataclass(frozen=True)
class Drain:
    """One worker configuration: ``manage.py COMMAND ARGS…`` in each of the W processes."""

    label: str
    command: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class IoWorker:
    """How a system's worker runs many tasks at once in one process (the I/O-bound phase,
    ``benchmarks.iodrain_phase``): ``manage.py COMMAND`` with these options."""

    command: str
    drain: tuple[str, ...]  # exit once nothing is left to run
    serve: tuple[str, ...]  # run until SIGTERM
    concurrency: str  # the option: tasks in flight in one process
    lease: str  # the option: seconds a claim lasts unless renewed (renewed every third of it)
    table: str  # the table its tasks live in (read by the driver, in plain SQL)
    running: str  # the status of a task in flight there
    succeeded: str  # the status of a task done
    bulk: str  # how its tasks are enqueued before a drain (untimed): its own bulk call (bulk_enqueue)
    #: A column above 0 once a task in flight has started, where a claimed task may wait its turn
    #: reserved first (ours: ``attempts``, counted when it starts); "" where every claim starts at once.
    started: str = ""


@dataclass(frozen=True)
class System:
    key: str
    name: str
    venv: Venv | None  # None: the interpreter that runs the benchmark (ours)
    apps: tuple[str, ...]  # INSTALLED_APPS besides the backport's django_tasks
    backend: str  # TASKS["default"]["BACKEND"]
    drains: tuple[Drain, ...]  # swept: in every round the best is the system's figure
    bulks: tuple[tuple[str, str], ...]  # (label, how): "loop" is Task.enqueue() per task
    settings: tuple[tuple[str, object], ...] = ()  # Django settings of its processes besides the common ones
    io: IoWorker | None = None  # None: not in the I/O-bound phase


# ---------------------------------------------------------------------------------------------
# OURS: django_taskclaim.tasks.ClaimBackend (issue 24), skipped with the reason where
# `django_taskclaim.tasks` cannot be imported. Its worker is `taskclaim_worker` with no handler
# (the backend's tasks), one task claimed at a time and 16; its bulk call is
# `django_taskclaim.tasks.enqueue_many` (one multi-row insert per 1,000 tasks), beside
# `Task.enqueue()`, as django-ox's is its own `enqueue_many`.
OURS_SYSTEM = System(
    key=OURS,
    name="django-taskclaim",
    venv=None,
    apps=("django_taskclaim",),
    backend="django_taskclaim.tasks.ClaimBackend",
    drains=(
        Drain("django-taskclaim (taskclaim_worker --queue default)", "taskclaim_worker",
              ("--queue", QUEUE, "--until-drained")),
        Drain("django-taskclaim (taskclaim_worker --queue default --batch 16)", "taskclaim_worker",
              ("--queue", QUEUE, "--until-drained", "--batch", "16")),
    ),
    bulks=(("django-taskclaim (Task.enqueue)", "loop"), ("django-taskclaim (enqueue_many)", "ours_many")),
    # A worker that finds nothing to claim while others still hold tasks looks again after this
    # (the default, 0.5 s, suits an idle queue): the peers' own loops run with no sleep either.
    settings=(("TASKCLAIM_POLL_INTERVAL", 0.01),),
    # Issue 32: `--concurrency N` tasks in flight per process (sync ones on N threads, async ones
    # on one event loop); the phase skips ours, saying so, where the option does not exist yet.
    io=IoWorker("taskclaim_worker", ("--queue", QUEUE, "--until-drained"), ("--queue", QUEUE), "--concurrency",
                "--lease", "django_taskclaim_task", "running", "succeeded", "ours_many", started="attempts"),
)
# ---------------------------------------------------------------------------------------------

# django-tasks-db on Python 3.11, Django 5.2 and the django-tasks backport. Its db_worker at its
# fastest: no sleep between tasks (--interval 0), no startup delay, no autoreloader, --batch to
# exit once the queue is empty; its queue filter (one queue, or '*') changes the claim query, so
# both are swept.
DTDB_SYSTEM = System(
    key=DTDB,
    name="django-tasks-db",
    venv=Venv(".venv-bench311", "3.11", (
        "Django>=5.2,<6", "django-tasks>=0.12,<0.13", "django-tasks-db>=0.13,<0.14", "psycopg[binary]>=3.1",
    )),
    apps=("django_tasks_db",),
    backend="django_tasks_db.DatabaseBackend",
    drains=tuple(
        Drain(f"django-tasks-db (db_worker, {what})", "db_worker",
              ("--queue-name", queues, "--interval", "0", "--batch", "--no-startup-delay", "--no-reload"))
        for what, queues in (("one queue", QUEUE), ("all queues", "*"))
    ),
    bulks=(("django-tasks-db (Task.enqueue)", "loop"),),
)

# django-ox needs Python 3.12+; it runs on Django 6.1's own django.tasks, its primary target. Its
# ox_worker claims on the main thread and runs tasks on a pool of --concurrency threads, so the
# concurrency is swept; --batch exits once a pass finds nothing and nothing is in flight. Its poll
# interval stays at the default: the loop never sleeps while it claims or while a task is in flight.
OX_CONCURRENCY = (1, 2, 4)
OX_SYSTEM = System(
    key=OX,
    name="django-ox",
    venv=Venv(".venv-bench312", "3.12", ("Django>=6.1,<6.2", "django-ox>=1.9,<2", "psycopg[binary]>=3.1")),
    apps=("django_ox",),
    backend="django_ox.backend.OxBackend",
    drains=tuple(
        Drain(f"django-ox (ox_worker --concurrency {c})", "ox_worker", ("--batch", "--concurrency", str(c)))
        for c in OX_CONCURRENCY
    ),
    bulks=(("django-ox (Task.enqueue)", "loop"), ("django-ox (enqueue_many)", "ox_many")),
    # ox_worker runs --concurrency threads, each one task at a time, an async task on a loop of
    # its own (asgiref's async_to_sync); one UPDATE renews every lease in flight each
    # LOCK_TIMEOUT / 3 (--lock-timeout).
    io=IoWorker("ox_worker", ("--batch",), (), "--concurrency", "--lock-timeout", "django_ox_oxtask", "RUNNING",
                "SUCCESSFUL", "ox_many"),
)

SYSTEMS: dict[str, System] = {s.key: s for s in (OURS_SYSTEM, DTDB_SYSTEM, OX_SYSTEM)}
PEERS = (DTDB, OX)


# -- inside a child process, after django.setup() -----------------------------------------------

def tables(key: str) -> list[str]:
    """The tables a system's tasks live in: emptied before each measurement."""
    if key == DTDB:
        from django_tasks_db.models import DBTaskResult

        return [DBTaskResult._meta.db_table]
    if key == OX:
        from django_ox.models import OxTask

        return [OxTask._meta.db_table]
    from django_taskclaim.models import Attempt, Task  # OURS: the task table ClaimBackend writes

    return [Attempt._meta.db_table, Task._meta.db_table]


def counts(key: str) -> tuple[int, int]:
    """(tasks succeeded, tasks not finished) in a system's table, after a drain."""
    if key == DTDB:
        from django_tasks_db.models import DBTaskResult

        done = DBTaskResult.objects.filter(status="SUCCESSFUL").count()
        return done, DBTaskResult.objects.exclude(status__in=["SUCCESSFUL", "FAILED"]).count()
    if key == OX:
        from django_ox.models import OxTask

        done = OxTask.objects.filter(status=OxTask.Status.SUCCESSFUL).count()
        unfinished = OxTask.objects.filter(
            status__in=[OxTask.Status.READY, OxTask.Status.RUNNING, OxTask.Status.WAITING]).count()
        return done, unfinished
    from django_taskclaim.models import Task  # OURS

    done = Task.objects.filter(status=Task.Status.SUCCEEDED).count()
    return done, Task.objects.filter(status__in=[Task.Status.PENDING, Task.Status.RUNNING]).count()


def bulk_enqueue(key: str, how: str, task: object, count: int, extra: tuple[object, ...] = ()) -> None:
    """Enqueue ``count`` calls of ``task`` (inside the caller's transaction) the way ``how`` says,
    call ``i`` with the arguments ``(i, *extra)``."""
    if how == "loop":
        for i in range(count):
            task.enqueue(i, *extra)  # type: ignore[attr-defined]
    elif how == "ox_many" and key == OX:
        from django_ox.bulk import enqueue_many

        enqueue_many(task, [((i, *extra), {}) for i in range(count)])
    elif how == "ours_many" and key == OURS:
        from django_taskclaim.tasks import enqueue_many as ours

        ours(task, [((i, *extra), {}) for i in range(count)])
    else:
        raise ValueError(f"{SYSTEMS[key].name} has no bulk enqueue {how!r}")
