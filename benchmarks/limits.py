"""What concurrency limits cost the queue claim, on PostgreSQL (issue 33, item 5).

    python -m benchmarks.limits --start-server [--n 2000] [--rounds 3]

One process, a private PostgreSQL. Each round, interleaved, for unlimited tasks and for tasks of 10
limited keys (limit 1,000 each: the keys never fill, so every claim takes the gate path: the
candidates' gates locked and the keys' running tasks counted again):

- ``claim_next()`` of one task, ``n`` times (each claimed task completed after, untimed): the p50
  and p99 of each call;
- a drain of ``n`` tasks by the one-task loop (``complete_and_claim_next``): tasks per second.

The target: limited ``claim_next`` p50 at most 1.3 × unlimited, the same round. django-ox 1.9.1
(the peer the Tasks benchmark installs) has no concurrency limits to compare a limited drain with.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KEYS = 10


def fill(n: int, limited: bool) -> None:
    from django_taskclaim.models import Attempt, Task

    Attempt.objects.all().delete()
    Task.objects.all().delete()
    Task.objects.bulk_create([
        Task(key=f"t:{i}", status="pending", queue="default",
             **({"concurrency_key": f"k{i % KEYS}", "concurrency_limit": 1000} if limited else {}))
        for i in range(n)])


def claims(n: int, limited: bool) -> list[float]:
    from django_taskclaim.models import Task

    fill(n, limited)
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        held = Task.objects.claim_next(owner="b", lease=300)
        took.append(time.perf_counter() - t0)
        for claim in held:  # untimed: a key's running tasks stay few, as under a limit they are
            claim.complete()
    return took


def drain(n: int, limited: bool) -> float:
    from django_taskclaim.models import Task

    fill(n, limited)
    t0 = time.perf_counter()
    held = Task.objects.claim_next(owner="b", lease=300)
    done = 0
    while held:
        held = held[0].complete_and_claim_next()
        done += 1
    return done / (time.perf_counter() - t0)


def run(n: int, rounds: int) -> list[str]:
    lines = ["| round | claim_next p50 µs (unlimited / limited) | p99 µs | ratio p50 | drain tasks/s "
             "(unlimited / limited) |", "|---:|---|---|---:|---|"]
    for r in range(1, rounds + 1):
        plain, limited = claims(n, False), claims(n, True)
        p50 = statistics.median(plain), statistics.median(limited)
        p99 = (statistics.quantiles(plain, n=100)[98], statistics.quantiles(limited, n=100)[98])
        rates = drain(n, False), drain(n, True)
        lines.append(f"| {r} | {p50[0] * 1e6:.0f} / {p50[1] * 1e6:.0f} | {p99[0] * 1e6:.0f} / {p99[1] * 1e6:.0f} "
                     f"| {p50[1] / p50[0]:.2f} | {rates[0]:.0f} / {rates[1]:.0f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.limits", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start-server", action="store_true", help="a private PostgreSQL (fsync on)")
    parser.add_argument("--pg-url", help="a PostgreSQL server to create the tables on")
    parser.add_argument("--n", type=int, default=2000, help="claims (and tasks drained) a kind (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: %(default)s)")
    parser.add_argument("--no-fsync", action="store_true",
                        help="the private server without fsync: the statements' cost, not the disk's")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    server: Any = None
    if args.start_server:
        from devtools.servers import PostgresServer

        durable = "off" if args.no_fsync else "on"
        server = PostgresServer(settings={"fsync": durable, "full_page_writes": durable}).start()
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

        call_command("migrate", verbosity=0)
        print("\n".join(run(args.n, args.rounds)))
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
