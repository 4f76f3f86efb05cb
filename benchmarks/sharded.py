"""Tenants routed over two PostgreSQL servers: the benchmark's by-key and drain phases against
two servers, and against one server in the same run.

    python -m benchmarks.sharded --start-servers          # two private servers (fsync on)
    python -m benchmarks.sharded --pg-url URL1 --pg-url URL2
    python -m benchmarks.sharded --start-servers --smoke  # seconds

Three set-ups, measured in interleaved rounds at W = 4 and 8 worker processes (each figure the
best round, as in ``python -m benchmarks``):

- ``one server``: no router, every task in the first server's database (the path of every
  project with one database);
- ``one server, router``: ``TASKCLAIM_ROUTER`` set, every tenant routed to that one database
  (what the router itself costs);
- ``two servers``: ``TASKCLAIM_ROUTER`` spreads the tenants over both servers by a hash.

Phases: by-key claim + complete of fresh keys of 16 tenants; a drain of queued no-op tasks of
those tenants, by the one-task loop (``claim_next`` then ``complete_and_claim_next``, which
stays in the database of the task it completes until that one is empty) and by the worker
helper ``work()`` (which, over several databases, completes and claims apart, so that each
``claim_next`` starts at the next database). Both servers run on this one machine: on a
2-core machine the figures show what routing costs, not a speed-up (the processes and the two
servers share the same two cores).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
ALIASES = ("default", "shard2")
LEASE = 30.0
SETUPS = ("one server", "one server, router", "two servers")
TASK = "django_taskclaim_task"
ATTEMPT = "django_taskclaim_attempt"
STEP = "django_taskclaim_step"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def by_tenant(tenant: str) -> str:
    """The router of the two-server set-up: a stable hash of the tenant picks its server."""
    return ALIASES[zlib.crc32(tenant.encode()) % len(ALIASES)]


def _even_tenants(per_server: int) -> list[str]:
    """Tenant names, ``per_server`` of them on each server by :func:`by_tenant`, alternating."""
    found: dict[str, list[str]] = {alias: [] for alias in ALIASES}
    n = 0
    while any(len(names) < per_server for names in found.values()):
        name = f"tenant-{n}"
        if len(found[by_tenant(name)]) < per_server:
            found[by_tenant(name)].append(name)
        n += 1
    return [name for pair in zip(*found.values(), strict=True) for name in pair]


def to_first(tenant: str) -> str:
    """The router of the ``one server, router`` set-up: every tenant in the first database."""
    return ALIASES[0]


#: 16 tenants, 8 on each server in the two-server set-up.
TENANTS = _even_tenants(8)


def use(setup: str) -> None:
    """Switch this (worker) process to ``setup``'s routing settings."""
    from django.test import override_settings

    if setup == "one server":
        values: dict[str, Any] = {"TASKCLAIM_ROUTER": None, "TASKCLAIM_DATABASES": [ALIASES[0]]}
    elif setup == "one server, router":
        values = {"TASKCLAIM_ROUTER": to_first, "TASKCLAIM_DATABASES": [ALIASES[0]]}
    else:
        values = {"TASKCLAIM_ROUTER": by_tenant, "TASKCLAIM_DATABASES": list(ALIASES)}
    override_settings(**values).enable()  # this process only


def connect_all() -> None:
    from django.db import connections

    for alias in ALIASES:
        connections[alias].ensure_connection()


@dataclass
class Sizes:
    workers: tuple[int, ...] = (4, 8)
    rounds: int = 2
    bykey_seconds: float = 3.0
    drain_tasks: int = 4_000


SMOKE = Sizes(workers=(2,), rounds=1, bykey_seconds=0.3, drain_tasks=200)


@dataclass
class Results:
    #: (phase, setup, W) -> rates of each round
    runs: dict[tuple[str, str, int], list[float]] = field(default_factory=dict)
    #: (loop, W) -> the share of tasks each server ran, in the two-server drain (last round)
    split: dict[tuple[str, int], dict[str, int]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def best(self, phase: str, setup: str, w: int) -> float:
        return max(self.runs.get((phase, setup, w), [0.0]))


# -- worker processes (forked by benchmarks.workers.run_workers) ------------------------------

def bykey(index: int, barrier: Any, setup: str, run: str, duration: float) -> dict[str, Any]:
    from django_taskclaim.models import Task

    use(setup)
    connect_all()
    owner = f"bench-{index}"

    def cycle(key: str, tenant: str) -> None:
        claim = Task.objects.claim(key, tenant=tenant, owner=owner, lease=LEASE).claim
        assert claim is not None, key
        claim.complete()

    for n in range(20):
        cycle(f"{run}:warm:{index}:{n}", TENANTS[n % len(TENANTS)])
    barrier.wait(300)
    start = time.perf_counter()
    end, n = start + duration, 0
    while time.perf_counter() < end:
        cycle(f"{run}:{index}:{n}", TENANTS[(index + n) % len(TENANTS)])
        n += 1
    return {"count": n, "start": start, "end": time.perf_counter()}


def drain_loop(index: int, barrier: Any, setup: str) -> dict[str, Any]:
    """The one-task loop: each completion claims the next task in its own database; a claim_next
    (which visits each database in turn) when that one has none left."""
    from django_taskclaim.models import Task

    use(setup)
    connect_all()
    owner = f"bench-drain-{index}"
    barrier.wait(300)
    start = time.perf_counter()
    executed: list[tuple[str, int]] = []
    claims = Task.objects.claim_next(owner=owner, lease=LEASE)
    while claims:
        claim = claims[0]
        executed.append((claim.using, claim.task_id))
        claims = claim.complete_and_claim_next() or Task.objects.claim_next(owner=owner, lease=LEASE)
    return {"executed": executed, "start": start, "end": time.perf_counter()}


def drain_worker(index: int, barrier: Any, setup: str) -> dict[str, Any]:
    """The worker helper as users run it: ``work(handler, until_drained=True)``."""
    from django_taskclaim.worker import work

    use(setup)
    connect_all()
    executed: list[tuple[str, int]] = []
    barrier.wait(300)
    start = time.perf_counter()
    work(lambda claim: executed.append((claim.using, claim.task_id)), owner=f"bench-worker-{index}",
         lease=LEASE, until_drained=True, poll=0.01)
    return {"executed": executed, "start": start, "end": time.perf_counter()}


# -- the driver ------------------------------------------------------------------------------

class Bench:
    def __init__(self, urls: list[str], sizes: Sizes) -> None:
        self.urls = dict(zip(ALIASES, urls, strict=True))
        self.sizes = sizes
        self.results = Results()

    def sql(self, alias: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.urls[alias], autocommit=True) as conn:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def clear(self) -> None:
        for alias in ALIASES:
            self.sql(alias, f"TRUNCATE {STEP}, {ATTEMPT}, {TASK} RESTART IDENTITY")

    def fill(self, setup: str, n: int) -> dict[str, int]:
        """``n`` queued no-op tasks, task g of tenant ``TENANTS[g % 16]``, each in its tenant's
        database for ``setup``; how many each database got."""
        route = by_tenant if setup == "two servers" else to_first
        placed: dict[str, int] = {}
        for alias in ALIASES:
            here = [t for t in TENANTS if route(t) == alias]
            if here:
                self.sql(
                    alias,
                    f'INSERT INTO {TASK} (tenant, "key", status, owner, fencing_token, attempts, max_attempts, '
                    f"payload_fingerprint, result_ref, error, created_at, updated_at, queue, priority, task_path) "
                    f"SELECT tenant, 'drain:' || g, 'pending', '', 0, 0, 5, '', '', '', now(), now(), 'default', 0, '' "
                    f"FROM (SELECT g, (%s::text[])[(g %% %s) + 1] AS tenant FROM generate_series(1, %s::bigint) g) s "
                    f"WHERE tenant = ANY(%s::text[])",
                    [TENANTS, len(TENANTS), n, here],
                )
                self.sql(alias, f"VACUUM ANALYZE {TASK}")
            placed[alias] = int(self.sql(alias, f"SELECT count(*) FROM {TASK}")[0][0])
        return placed

    def bykey(self) -> None:
        from .workers import run_workers

        s = self.sizes
        for w in s.workers:
            for n in range(s.rounds):
                for setup in SETUPS:
                    self.clear()
                    out = run_workers(bykey, w, (setup, f"bk-{w}-{n}", s.bykey_seconds))
                    value = sum(r["count"] for r in out) / span(out)
                    self.results.runs.setdefault(("by-key", setup, w), []).append(value)
                    log(f"  by-key {setup:18} W={w} round {n + 1}/{s.rounds}: {value:,.0f} claim+complete/s")

    def drain(self) -> None:
        from .workers import run_workers

        s = self.sizes
        for w in s.workers:
            for n in range(s.rounds):
                for loop, target in (("drain, one-task loop", drain_loop), ("drain, work()", drain_worker)):
                    for setup in SETUPS:
                        self.clear()
                        placed = self.fill(setup, s.drain_tasks)
                        out = run_workers(target, w, (setup,))
                        executed = [tuple(e) for r in out for e in r["executed"]]
                        if len(set(executed)) != s.drain_tasks or len(executed) != s.drain_tasks:
                            raise RuntimeError(f"{loop} {setup} W={w}: {len(executed)} executions of "
                                               f"{len(set(executed))} tasks, expected {s.drain_tasks} once each")
                        done = sum(int(self.sql(a, f"SELECT count(*) FROM {TASK} WHERE status = 'succeeded'")[0][0])
                                   for a in ALIASES)
                        if done != s.drain_tasks:
                            raise RuntimeError(f"{loop} {setup} W={w}: {done} tasks succeeded")
                        value = s.drain_tasks / span(out)
                        self.results.runs.setdefault((loop, setup, w), []).append(value)
                        if setup == "two servers":
                            self.results.split[(loop, w)] = placed
                        log(f"  {loop:20} {setup:18} W={w} round {n + 1}/{s.rounds}: {value:,.0f} tasks/s")


def span(out: list[dict[str, Any]]) -> float:
    return max(r["end"] for r in out) - min(r["start"] for r in out)


def markdown(results: Results, sizes: Sizes) -> str:
    lines = ["| phase | W | one server | one server, router | two servers | two servers / one server |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    phases = ("by-key", "drain, one-task loop", "drain, work()")
    for phase in phases:
        unit = "claim+complete/s" if phase == "by-key" else "tasks/s"
        for w in sizes.workers:
            one, router, two = (results.best(phase, setup, w) for setup in SETUPS)
            lines.append(f"| {phase} ({unit}) | {w} | {one:,.0f} | {router:,.0f} | {two:,.0f} | "
                         f"{two / one if one else 0:.2f} |")
    notes = [f"- {name}: {value}" for name, value in results.env.items()]
    for (loop, w), placed in sorted(results.split.items()):
        notes.append(f"- {loop}, W={w}, two servers: tasks per server {placed}")
    notes.append(f"- every figure: the best of {sizes.rounds} interleaved round(s); by-key {sizes.bykey_seconds:g} s "
                 f"per round, drains of {sizes.drain_tasks:,} tasks")
    return "\n".join(lines + [""] + notes) + "\n"


def configure(urls: list[str]) -> None:
    """Django settings for the driver and its forked workers: both servers, persistent connections."""
    from django.conf import settings

    def database(url: str) -> dict[str, Any]:
        parts = urlsplit(url)
        return {"ENGINE": "django.db.backends.postgresql", "NAME": unquote(parts.path.lstrip("/")),
                "HOST": parts.hostname or "127.0.0.1", "PORT": str(parts.port or 5432),
                "USER": unquote(parts.username or "postgres"), "PASSWORD": unquote(parts.password or ""),
                "CONN_MAX_AGE": None}

    settings.configure(
        SECRET_KEY="benchmarks-only-not-secret", USE_TZ=True, TIME_ZONE="UTC",  # noqa: S106
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField", INSTALLED_APPS=["django_taskclaim"],
        DATABASES={alias: database(url) for alias, url in zip(ALIASES, urls, strict=True)},
        LOGGING={"version": 1, "disable_existing_loggers": False,
                 "handlers": {"null": {"class": "logging.NullHandler"}},
                 "loggers": {"django_taskclaim": {"handlers": ["null"], "level": "WARNING", "propagate": False}}},
    )


def run(urls: list[str], sizes: Sizes, out: str | None, argv: list[str]) -> int:
    import django

    configure(urls)
    django.setup()
    from django.core.management import call_command
    from django.db import connections

    for alias in ALIASES:
        call_command("migrate", database=alias, verbosity=0)
    connections.close_all()
    bench = Bench(urls, sizes)
    bench.results.env = {
        "machine": f"{os.cpu_count()} CPU(s) (nproc); load average at start "
                   f"{' / '.join(f'{v:.2f}' for v in os.getloadavg())}",
        "postgresql": bench.sql(ALIASES[0], "SHOW server_version")[0][0],
        "pg settings (each server)": ", ".join(
            f"{name}={bench.sql(ALIASES[0], f'SHOW {name}')[0][0]}" for name in ("fsync", "synchronous_commit")),
        "command": "python -m benchmarks.sharded " + " ".join(argv),
    }
    log("phase: by-key claim + complete")
    bench.bykey()
    log("phase: queue drain")
    bench.drain()
    bench.results.env["load average at end"] = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    text = markdown(bench.results, sizes)
    print(text, flush=True)
    if out:
        Path(out).write_text(text)
        log(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sharded", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--pg-url", action="append", help="a PostgreSQL server (twice: the two servers)")
    where.add_argument("--start-servers", action="store_true",
                       help="start two private PostgreSQL servers on 127.0.0.1 (fsync=on, full_page_writes=on)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: seconds")
    parser.add_argument("--db-name", default="taskclaim_bench_sharded",
                        help="database created (dropped first) on each server (default: %(default)r)")
    parser.add_argument("--out", default=None, help="also write the Markdown table to this file")
    args = parser.parse_args(argv)
    if args.pg_url is not None and len(args.pg_url) != 2:
        parser.error("give --pg-url twice: one for each server")
    from .__main__ import create_database, drop_database  # the main benchmark's: a database of the run's own

    sizes = SMOKE if args.smoke else Sizes()
    servers: list[Any] = []
    try:
        if args.start_servers:
            sys.path.insert(0, str(ROOT))
            from devtools.servers import PostgresServer

            for _ in ALIASES:
                servers.append(PostgresServer(settings={"fsync": "on", "full_page_writes": "on"}).start())
            log("started PostgreSQL on 127.0.0.1:" + " and :".join(str(s.port) for s in servers))
            maintenance = [s.url for s in servers]
        else:
            maintenance = list(args.pg_url)
        urls = [create_database(m, args.db_name) for m in maintenance]
        try:
            return run(urls, sizes, args.out, argv)
        finally:
            for m in maintenance:
                drop_database(m, args.db_name)
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
