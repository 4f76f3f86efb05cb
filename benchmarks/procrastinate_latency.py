"""procrastinate in the latency phase, in a child process under its own virtualenv
(``.venv-bench-procrastinate``, made on first use): its worker, and the process that enqueues.

    python -m benchmarks.procrastinate_latency setup           # its schema; its versions
    python -m benchmarks.procrastinate_latency worker          # @@ready, then run_worker on a "go" line
    python -m benchmarks.procrastinate_latency latency N       # N tasks one at a time, as tasks_runner's

``TASKCLAIM_BENCH_URL`` names the database, ``TASKCLAIM_BENCH_STAMPS`` the folder the task writes its
start to. Standard library and procrastinate only.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

READY, RESULT = "@@ready", "@@result "
QUEUE = "taskclaim_latency"
WARMUP = 5


def app() -> tuple[Any, Any]:
    import procrastinate

    connector = procrastinate.PsycopgConnector(conninfo=os.environ["TASKCLAIM_BENCH_URL"])
    application = procrastinate.App(connector=connector)

    @application.task(name="taskclaim_latency_stamp", queue=QUEUE)
    def stamp(i: int) -> None:
        started = time.time()
        path = Path(os.environ["TASKCLAIM_BENCH_STAMPS"]) / str(i)
        path.with_suffix(".part").write_text(repr(started))
        path.with_suffix(".part").rename(path)

    return application, stamp


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    role, *rest = argv
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    application, stamp = app()
    out: dict[str, Any]
    if role == "setup":
        import psycopg

        with psycopg.connect(os.environ["TASKCLAIM_BENCH_URL"], autocommit=True) as conn:
            row = conn.execute("SELECT to_regclass('procrastinate_jobs') IS NOT NULL").fetchone()
        if not (row and row[0]):
            with application.open():
                application.schema_manager.apply_schema()
        with psycopg.connect(os.environ["TASKCLAIM_BENCH_URL"], autocommit=True) as conn:
            conn.execute("TRUNCATE procrastinate_jobs CASCADE")
        out = {"procrastinate": version("procrastinate"), "psycopg": version("psycopg"),
               "python": sys.version.split()[0]}
    elif role == "worker":
        say(READY)
        if not sys.stdin.readline():
            raise SystemExit("no start signal: the driver went away")
        # Its defaults: LISTEN/NOTIFY on (listen_notify), its own poll interval; one job at a time.
        application.run_worker(queues=[QUEUE], concurrency=1, wait=True)
        out = {}
    elif role == "latency":
        where, pauses, found = Path(os.environ["TASKCLAIM_BENCH_STAMPS"]), random.Random(0), []
        with application.open():
            for i in range(WARMUP + int(rest[0])):
                time.sleep(pauses.uniform(0.05, 0.15))  # the idle time being measured
                enqueued = time.time()
                stamp.defer(i=i)
                path, deadline = where / str(i), enqueued + 60
                while not path.exists():
                    if time.time() > deadline:
                        raise RuntimeError(f"job {i} did not start within 60 s")
                    time.sleep(0.001)  # a poll of the file the job writes
                if i >= WARMUP:
                    found.append(float(path.read_text()) - enqueued)
        out = {"latencies": found}
    else:
        raise SystemExit(f"unknown role {role!r}")
    say(RESULT + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
