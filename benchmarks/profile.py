"""Per-operation profile: client CPU, server time, round trips and commits of each operation.

    python -m benchmarks.profile --start-server [--n 2000]

One process runs each operation ``n`` times on a private PostgreSQL (``fsync=on``) with
``pg_stat_statements`` loaded. Per operation it reports the client's CPU time (this process's
``time.process_time``), the server's execution time (``pg_stat_statements``: the executor's run,
not its set-up), the CPU time of the server process serving the operations (read from
``/proc`` when the server runs on this machine: parse, bind, plan set-up, locks, commit and
all), the round trips
(statements sent, counted with Django's ``execute_wrapper``) and the commits that wrote (the
transaction ids the server handed out: each such commit waits for a WAL flush). Run it on a
quiet machine: other work inflates the client CPU figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

Operation = tuple[str, Callable[[int], Any], Callable[[int], Any] | None]


def operations() -> list[Operation]:
    """(name, the operation on item i, the untimed set-up of item i)."""
    from django_taskclaim.models import Task

    claims: dict[int, Any] = {}

    def claim_new(i: int) -> Any:
        return Task.objects.claim(f"new:{i}", owner="p", lease=30)

    def claim_pending(i: int) -> Any:
        return Task.objects.claim(f"pending:{i}", owner="p", lease=30)

    def hold(prefix: str) -> Callable[[int], Any]:
        def setup(i: int) -> None:
            claims[i] = Task.objects.claim(f"{prefix}:{i}", owner="p", lease=30).claim
        return setup

    def drain_setup(i: int) -> None:
        if i == 0:
            Task.objects.bulk_create([Task(key=f"queue:{n}", status="pending", queue="default") for n in range(2 * N)])
            claims[0] = Task.objects.claim_next(owner="p", lease=30)[0]

    def complete_and_claim_next(i: int) -> Any:
        nxt = claims[0].complete_and_claim_next()
        claims[0] = nxt[0]

    return [
        ("claim (new key)", claim_new, None),
        ("claim (pending task)", claim_pending, lambda i: Task.objects.ensure(f"pending:{i}")),
        ("heartbeat", lambda i: claims[i].heartbeat(), hold("hb")),
        ("complete", lambda i: claims[i].complete({"n": i}), hold("done")),
        ("claim_next (1)", lambda i: Task.objects.claim_next(owner="p", lease=30),
         lambda i: Task.objects.ensure(f"next:{i}", queue="default")),
        ("complete_and_claim_next", complete_and_claim_next, drain_setup),
        ("duplicate (done task)", lambda i: Task.objects.claim("dup", owner="p", lease=30),
         lambda i: Task.objects.claim("dup", owner="p").claim.complete() if i == 0 else None),  # type: ignore[union-attr]
    ]


N = 2000


def stat_statements(cursor: Any) -> tuple[float, int]:
    """(total server execution ms, calls) of this database's statements so far."""
    cursor.execute("SELECT coalesce(sum(total_exec_time), 0), coalesce(sum(calls), 0) FROM pg_stat_statements "
                   "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                   "AND query NOT ILIKE '%%pg_stat%%'")
    ms, calls = cursor.fetchone()
    return float(ms), int(calls)


def backend_cpu(pid: int) -> float | None:
    """CPU seconds the server process ``pid`` has used, from ``/proc``; ``None`` where it is not
    on this machine (a remote server) or ``/proc`` is missing."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def commits(cursor: Any) -> int:
    """The next transaction id: how many transactions that wrote (each a WAL flush at commit with
    fsync on) the server has begun. Read from a snapshot, which assigns no id itself."""
    cursor.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
    return int(cursor.fetchone()[0])


def profile(n: int) -> list[dict[str, Any]]:
    import psycopg
    from django.db import connection

    from django_taskclaim.models import Attempt, Task

    global N
    N = n
    monitor = psycopg.connect(os.environ["TASKCLAIM_BENCH_URL"], autocommit=True)
    rows = []
    for name, operation, setup in operations():
        Attempt.objects.all().delete()
        Task.objects.all().delete()
        for i in range(n):
            if setup is not None:
                setup(i)
        sent = 0

        def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            nonlocal sent
            sent += 1
            return execute(sql, params, many, context)

        with monitor.cursor() as cur:
            monitor.execute("SELECT pg_stat_statements_reset()")
            before_commits = commits(cur)
        connection.ensure_connection()
        pid = connection.connection.info.backend_pid
        backend0 = backend_cpu(pid)
        with connection.execute_wrapper(count):
            cpu0 = time.process_time()
            wall0 = time.perf_counter()
            for i in range(n):
                operation(i)
            wall = time.perf_counter() - wall0
            cpu = time.process_time() - cpu0
        backend1 = backend_cpu(pid)
        backend_us = None if backend0 is None or backend1 is None else 1e6 * (backend1 - backend0) / n
        with monitor.cursor() as cur:
            server_ms, _ = stat_statements(cur)
            done_commits = commits(cur) - before_commits
        rows.append({"operation": name, "client_cpu_us": 1e6 * cpu / n, "server_us": 1e3 * server_ms / n,
                     "backend_cpu_us": backend_us, "wall_us": 1e6 * wall / n, "round_trips": sent / n,
                     "commits": done_commits / n})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| operation | client CPU µs | server µs | server process CPU µs | wall µs | round trips "
           "| writing commits |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        backend = "n/a" if r["backend_cpu_us"] is None else f"{r['backend_cpu_us']:.0f}"
        out.append(f"| {r['operation']} | {r['client_cpu_us']:.0f} | {r['server_us']:.0f} | {backend} "
                   f"| {r['wall_us']:.0f} | {r['round_trips']:.2f} | {r['commits']:.2f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start-server", action="store_true", help="a private PostgreSQL with pg_stat_statements")
    parser.add_argument("--pg-url", help="a server with pg_stat_statements in shared_preload_libraries")
    parser.add_argument("--n", type=int, default=2000, help="operations of each kind (default: %(default)s)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    server = None
    if args.start_server:
        from devtools.servers import PostgresServer

        server = PostgresServer(settings={"fsync": "on", "full_page_writes": "on",
                                          "shared_preload_libraries": "pg_stat_statements"}).start()
        url = server.url
    elif args.pg_url:
        url = args.pg_url
    else:
        parser.error("give --start-server or --pg-url")
    try:
        os.environ["TASKCLAIM_BENCH_URL"] = url
        os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        print(table(profile(args.n)))
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
