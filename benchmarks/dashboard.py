"""What the admin dashboard costs at 1 and 10 million finished tasks, on PostgreSQL (issue 45).

    python -m benchmarks.dashboard --start-server [--rows 1000000,10000000] [--days 30]

The task and attempt tables are filled by ``INSERT … SELECT generate_series`` (not through the
claims: minutes, not hours), afresh for each size: finished tasks in id order spread evenly over the last
``--days`` days (so 10 million over 30 days is about 333,000 a day, 14,000 an hour), over 8 queues
and 24 task paths, each with one attempt (90 % succeeded, 8 % failed, 2 % retried), started 0–3 s
after it was enqueued and run 10 ms–2 s; and 200 running tasks, 50 of them with progress. Then, after
``ANALYZE``, for each size: each of the page's queries (the median of 5 runs after one warm-up) and
the whole page as a logged-in superuser gets it through Django's test client (``?window=1h`` and
``1d``), and the plan of the heaviest query (``EXPLAIN ANALYZE``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RUNS = 5

FILL_TASKS = """
INSERT INTO django_taskclaim_task (tenant, "key", status, owner, fencing_token, attempts, max_attempts,
    payload_fingerprint, result_ref, error, created_at, updated_at, queue, priority, task_path, concurrency_key)
SELECT '', 'bench:' || g, CASE WHEN g %% 50 < 45 THEN 'succeeded' ELSE 'failed' END, 'w' || (g %% 16), 1, 1, 5,
    '', '', '', now() - make_interval(secs => %s * (1 - (g - %s)::float8 / %s)), now(),
    'q' || (g %% 8), 0, 'app.tasks.job' || (g %% 24), ''
FROM generate_series(%s + 1, %s + %s) g
"""
FILL_ATTEMPTS = """
INSERT INTO django_taskclaim_attempt (task_id, token, owner, delivery_id, started_at, ended_at, outcome,
    stale_writes, error, error_class, traceback)
SELECT t.id, 1, t.owner, '', t.created_at + make_interval(secs => (t.id %% 3000) / 1000.0),
    t.created_at + make_interval(secs => (t.id %% 3000) / 1000.0 + 0.01 + (t.id %% 1990) / 1000.0),
    CASE WHEN t.id %% 50 < 45 THEN 'succeeded' WHEN t.id %% 50 < 49 THEN 'failed' ELSE 'retry' END,
    CASE WHEN t.id %% 1000 = 0 THEN 1 ELSE 0 END, '', '', ''
FROM django_taskclaim_task t WHERE t.id > %s
"""
RUNNING = """
INSERT INTO django_taskclaim_task (tenant, "key", status, owner, fencing_token, attempts, max_attempts,
    lease_expires_at, payload_fingerprint, result_ref, error, created_at, updated_at, queue, priority,
    task_path, concurrency_key, progress, progress_note, progress_token)
SELECT '', 'running:' || g, 'running', 'w' || (g %% 16), 1, 1, 5, now() + interval '5 minutes', '', '', '',
    now(), now(), 'q' || (g %% 8), 0, 'app.tasks.job' || (g %% 24), '',
    CASE WHEN g %% 4 = 0 THEN (g %% 100) / 100.0 END, CASE WHEN g %% 4 = 0 THEN 'step ' || g END,
    CASE WHEN g %% 4 = 0 THEN 1 END
FROM generate_series(1, 200) g
"""


def timed(call: Callable[[], Any]) -> float:
    """The median seconds of ``RUNS`` calls of ``call``, after one not counted (the cache warmed)."""
    call()
    took = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        call()
        took.append(time.perf_counter() - t0)
    return statistics.median(took)


def fill(rows: int, days: float) -> float:
    """Fill the tables afresh with ``rows`` finished tasks (and their attempts), created in id order
    over the last ``days`` (as a queue's tasks are: a task's id grows with its creation time), and
    the 200 running ones; the seconds it took."""
    from django.db import connection

    t0 = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_taskclaim_attempt, django_taskclaim_task RESTART IDENTITY")
        cursor.execute(FILL_TASKS, [days * 86400, 0, rows, 0, 0, rows])
        cursor.execute(FILL_ATTEMPTS, [0])
        cursor.execute(RUNNING, [])
        cursor.execute("VACUUM ANALYZE django_taskclaim_task")
        cursor.execute("VACUUM ANALYZE django_taskclaim_attempt")
    return time.perf_counter() - t0


def measure(rows: int, fill_seconds: float) -> list[str]:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.urls import reverse

    from django_taskclaim import dashboard
    from django_taskclaim.admin_views import schedule_overview
    from django_taskclaim.models import Attempt
    from django_taskclaim.store import DbNowPlus

    user = User.objects.filter(username="bench").first() or User.objects.create_superuser("bench")
    client = Client()
    client.force_login(user)
    url = reverse("admin:django_taskclaim_dashboard")
    figures: dict[str, float] = {}
    for name, (seconds, step) in dashboard.WINDOWS.items():
        figures[f"first task id {name}"] = timed(lambda s=seconds: dashboard.first_task("default", s))
        figures[f"group figures {name} (with the first task id)"] = timed(
            lambda s=seconds: dashboard.group_figures("default", s))
        figures[f"chart over time {name}"] = timed(lambda s=seconds, st=step: dashboard.series("default", s, st))
    figures["running tasks"] = timed(lambda: dashboard.running("default"))
    figures["limits' waiting tasks"] = timed(lambda: dashboard.limits_waiting("default"))
    figures["schedules"] = timed(schedule_overview)
    for name in dashboard.WINDOWS:
        def page(n: str = name) -> None:
            response = client.get(url, {"window": n})
            assert response.status_code == 200, response.status_code
        figures[f"whole page ?window={name}"] = timed(page)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('django_taskclaim_attempt')), "
                       "pg_size_pretty(pg_total_relation_size('django_taskclaim_task'))")
        attempt_size, task_size = cursor.fetchone()
    in_day = Attempt.objects.filter(started_at__gte=DbNowPlus(-86400)).count()
    in_hour = Attempt.objects.filter(started_at__gte=DbNowPlus(-3600)).count()
    lines = [f"### {rows:,} finished tasks", "",
             f"Filled in {fill_seconds:.0f} s; attempt table {attempt_size}, task table {task_size}; "
             f"{in_hour:,} attempts in the last hour, {in_day:,} in the last day.", "",
             "| query | median ms |", "|---|---:|"]
    lines += [f"| {name} | {seconds * 1000:.1f} |" for name, seconds in figures.items()]
    plan = dashboard_plan()
    lines += ["", "The day's group figures, `EXPLAIN (ANALYZE, BUFFERS)`:", "", "```", *plan, "```", ""]
    return lines


def dashboard_plan() -> list[str]:
    """The plan of the day's group figures (the query ``group_figures`` sends, in its transaction),
    run by the server."""
    from django_taskclaim import dashboard

    with dashboard.reporting("default"):
        first = dashboard.first_task("default", 86400)
        assert first is not None
        return str(dashboard.figures_query("default", 86400, first).explain(analyze=True, buffers=True)).splitlines()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dashboard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start-server", action="store_true", help="a private PostgreSQL (fsync off: the fill)")
    parser.add_argument("--pg-url", help="a PostgreSQL server to create the tables on")
    parser.add_argument("--rows", default="1000000,10000000",
                        help="finished tasks to measure at, each size filled afresh (default: %(default)s)")
    parser.add_argument("--days", type=float, default=30.0,
                        help="the span the tasks spread over (default: %(default)s)")
    args = parser.parse_args(argv)
    sizes = sorted(int(n) for n in args.rows.split(","))
    sys.path.insert(0, str(ROOT))
    server: Any = None
    if args.start_server:
        from devtools.servers import PostgresServer

        server = PostgresServer(settings={"fsync": "off", "full_page_writes": "off"}).start()
        url = server.url
    elif args.pg_url:
        url = args.pg_url
    else:
        parser.error("give --start-server or --pg-url")
    try:
        os.environ["TASKCLAIM_BENCH_URL"] = url
        os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.dashboard_settings"
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        for rows in sizes:
            took = fill(rows, args.days)
            print("\n".join(measure(rows, took)), flush=True)
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
