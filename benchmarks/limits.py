"""What concurrency limits cost the queue claim, on PostgreSQL (issue 33, item 5).

    python -m benchmarks.limits --start-server [--n 2000] [--rounds 3]

One process, a private PostgreSQL. Each round, interleaved, for unlimited tasks and for tasks of 10
limited keys (limit 1,000 each: the keys never fill, so every claim takes the gate path: the
candidates' gates locked and the keys' running tasks counted again):

- ``claim_next()`` of one task, ``n`` times of each kind, alternating call by call (two queues of
  one table; each claimed task completed after, untimed): the p50 and p99 of each call;
- a drain of ``n`` tasks by the one-task loop (``complete_and_claim_next``): tasks per second.

The target: limited ``claim_next`` p50 at most 1.3 × unlimited, the same round.

With ``--peers W``, the drain the issue compares with django-ox's limited drain, at W worker
processes, by the Django Tasks phase's machinery (``benchmarks.tasks_phase``): our no-op tasks of 10
limited keys (``benchmarks.limited_tasks``: limit 1,000, never full, and limit 1, which throttles)
beside django-ox 1.9.1's unlimited drain. django-ox 1.9.1, its newest release, has no concurrency
limits; a limited drain can be no faster than an unlimited one, so its unlimited drain bounds its
limited drain from above, and ours limited over its unlimited is a lower bound of the ratio asked
for. Each side's figure is its best worker configuration of the round (ours: one task a claim and
``--batch 16``; django-ox: ``--concurrency`` 1, 2, 4), as in the Tasks phase.
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


def paired(n: int) -> tuple[list[float], list[float]]:
    """``claim_next()`` of one task, ``n`` times from a queue of unlimited tasks and ``n`` times from
    a queue of tasks of 10 limited keys (limit 1,000), alternating call by call in one table, so that
    load from elsewhere falls on both alike (each claimed task completed after, untimed)."""
    from django_taskclaim.models import Attempt, Task

    Attempt.objects.all().delete()
    Task.objects.all().delete()
    Task.objects.bulk_create([Task(key=f"u:{i}", status="pending", queue="plain") for i in range(n)] + [
        Task(key=f"l:{i}", status="pending", queue="limited", concurrency_key=f"k{i % KEYS}",
             concurrency_limit=1000) for i in range(n)])
    took: dict[str, list[float]] = {"plain": [], "limited": []}
    for i in range(n):
        for queue in ("plain", "limited") if i % 2 else ("limited", "plain"):
            t0 = time.perf_counter()
            held = Task.objects.claim_next(owner="b", lease=300, queue=queue)
            took[queue].append(time.perf_counter() - t0)
            for claim in held:
                claim.complete()
    return took["plain"], took["limited"]


def run(n: int, rounds: int) -> list[str]:
    lines = ["| round | claim_next p50 µs (unlimited / limited) | p99 µs | ratio p50 | drain tasks/s "
             "(unlimited / limited) |", "|---:|---|---|---:|---|"]
    for r in range(1, rounds + 1):
        plain, limited = paired(n)
        p50 = statistics.median(plain), statistics.median(limited)
        p99 = (statistics.quantiles(plain, n=100)[98], statistics.quantiles(limited, n=100)[98])
        rates = drain(n, False), drain(n, True)
        lines.append(f"| {r} | {p50[0] * 1e6:.0f} / {p50[1] * 1e6:.0f} | {p99[0] * 1e6:.0f} / {p99[1] * 1e6:.0f} "
                     f"| {p50[1] / p50[0]:.2f} | {rates[0]:.0f} / {rates[1]:.0f} |")
    return lines


def peers(url: str, w: int, n: int, rounds: int) -> list[str]:
    """Interleaved rounds of our drains (unlimited, 10 keys of limit 1,000, 10 keys of limit 1) and
    django-ox's unlimited drain, W workers, ``n`` tasks each; a table of each round's rates."""
    from .tasks_phase import Runner, drain_with
    from .tasks_systems import OURS, OX, SYSTEMS

    runner = Runner(url, lambda line: print(line, file=sys.stderr))
    for key in (OURS, OX):
        found = runner.setup(SYSTEMS[key])
        if "error" in found:
            return [f"{SYSTEMS[key].name} cannot run here: {found['error']}"]
    kinds = {"unlimited": (), "10 keys, limit 1,000": ("limited-wide",), "10 keys, limit 1": ("limited-tight",)}
    lines = [f"W = {w}, {n} no-op tasks a drain; tasks/s, each side's best worker configuration of the round",
             "", "| round | django-ox 1.9.1 unlimited | ours unlimited | ours 10 keys, limit 1,000 | ours 10 keys, "
             "limit 1 | ours limited (1,000 / 1) ÷ django-ox unlimited |", "|---:|---:|---:|---:|---:|---|"]
    for r in range(1, rounds + 1):
        ox = max(drain_with(runner, OX, d.label, (d.command, *d.args), w, n)[1] for d in SYSTEMS[OX].drains)
        ours = {label: max(drain_with(runner, OURS, d.label, (d.command, *d.args), w, n, task)[1]
                           for d in SYSTEMS[OURS].drains) for label, task in kinds.items()}
        wide, tight = ours["10 keys, limit 1,000"], ours["10 keys, limit 1"]
        lines.append(f"| {r} | {ox:,.0f} | {ours['unlimited']:,.0f} | {wide:,.0f} | {tight:,.0f} "
                     f"| {wide / ox:.2f} / {tight / ox:.2f} |")
        print(lines[-1], file=sys.stderr)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.limits", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start-server", action="store_true", help="a private PostgreSQL (fsync on)")
    parser.add_argument("--pg-url", help="a PostgreSQL server to create the tables on")
    parser.add_argument("--n", type=int, default=2000, help="claims (and tasks drained) a kind (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: %(default)s)")
    parser.add_argument("--peers", type=int, metavar="W",
                        help="also our limited drains beside django-ox's unlimited one, W workers")
    parser.add_argument("--claims", action=argparse.BooleanOptionalAction, default=True,
                        help="the claim_next rounds (default: on)")
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
        if args.claims:
            print("\n".join(run(args.n, args.rounds)))
        if args.peers:
            print("\n".join(peers(url, args.peers, args.n, args.rounds)))
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
