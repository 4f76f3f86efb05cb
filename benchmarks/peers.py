"""The peers: procrastinate and django-tasks-db draining no-op jobs with their own workers.

Each is optional (the ``bench`` extra installs both); ``available()`` says which import.
"""

from __future__ import annotations

import importlib.util
import logging
import time
import uuid
from typing import Any

from .workers import BARRIER_TIMEOUT

PROCRASTINATE_QUEUE = "taskclaim_bench"


def available() -> dict[str, bool]:
    from django.conf import settings

    return {
        "procrastinate": importlib.util.find_spec("procrastinate") is not None,
        "django-tasks-db": bool(getattr(settings, "HAVE_DJANGO_TASKS_DB", False)),
    }


def version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as v

    try:
        return v(dist)
    except PackageNotFoundError:
        return "not installed"


# -- procrastinate ----------------------------------------------------------------------------

def _procrastinate_app(url: str) -> tuple[Any, Any, list[int]]:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))
    executed: list[int] = []

    @app.task(name="taskclaim_bench_noop", queue=PROCRASTINATE_QUEUE)
    def noop(i: int) -> None:
        executed.append(i)

    return app, noop, executed


def procrastinate_setup(url: str) -> None:
    app, _, _ = _procrastinate_app(url)
    with app.open():
        app.schema_manager.apply_schema()


def procrastinate_fill(url: str, count: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE procrastinate_jobs CASCADE")
    app, noop, _ = _procrastinate_app(url)
    with app.open():
        for start in range(0, count, 5000):
            noop.batch_defer(*({"i": i} for i in range(start, min(count, start + 5000))))


def procrastinate_worker(index: int, barrier: Any, url: str, concurrency: int) -> dict[str, Any]:
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    app, _, executed = _procrastinate_app(url)
    barrier.wait(BARRIER_TIMEOUT)
    start = time.perf_counter()
    app.run_worker(queues=[PROCRASTINATE_QUEUE], concurrency=concurrency, wait=False,
                   install_signal_handlers=False, listen_notify=False, name=f"bench-{index}")
    return {"executed": list(executed), "start": start, "end": time.perf_counter()}


def procrastinate_left(url: str) -> tuple[int, int]:
    """(jobs not yet finished, jobs succeeded)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status IN ('todo', 'doing')), "
            "count(*) FILTER (WHERE status = 'succeeded') FROM procrastinate_jobs"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


# -- django-tasks-db ----------------------------------------------------------------------------

def dtdb_fill(count: int) -> None:
    """Enqueue one job through the backend, then bulk-insert copies of its row (fast setup)."""
    from django.db import connections
    from django_tasks_db.models import DBTaskResult

    from .dtdb_tasks import noop

    DBTaskResult.objects.all().delete()
    template = DBTaskResult.objects.get(id=noop.enqueue(0).id)
    rows = [
        DBTaskResult(
            id=uuid.uuid4(), status=template.status, args_kwargs={"args": [i], "kwargs": {}},
            priority=template.priority, task_path=template.task_path, queue_name=template.queue_name,
            backend_name=template.backend_name, run_after=template.run_after,
        )
        for i in range(1, count)
    ]
    DBTaskResult.objects.bulk_create(rows, batch_size=5000)
    connections.close_all()


def dtdb_worker(index: int, barrier: Any, queues: str) -> dict[str, Any]:
    """django-tasks-db's own worker loop (``manage.py db_worker``) at its fastest: no sleep between
    tasks (``--interval 0``), no startup delay, persistent connections; ``queues`` "one" filters on
    the job's queue (``--queue-name``), "all" asks for every queue (``--queue-name '*'``)."""
    from django.db import connection
    from django_tasks_db.management.commands.db_worker import Worker

    from .dtdb_tasks import EXECUTED, noop

    connection.ensure_connection()
    worker = Worker(queue_names=[noop.queue_name] if queues == "one" else ["*"], interval=0.0, batch=True,
                    backend_name="default", startup_delay=False, max_tasks=None, worker_id=f"bench-{index}",
                    excluded_queue_names=[])
    barrier.wait(BARRIER_TIMEOUT)
    start = time.perf_counter()
    worker.run()
    return {"executed": list(EXECUTED), "start": start, "end": time.perf_counter()}


def dtdb_left() -> tuple[int, int]:
    from django.db import connections
    from django_tasks_db.models import DBTaskResult

    try:
        left = DBTaskResult.objects.exclude(status__in=["SUCCESSFUL", "FAILED"]).count()
        done = DBTaskResult.objects.filter(status="SUCCESSFUL").count()
    finally:
        connections.close_all()
    return left, done
