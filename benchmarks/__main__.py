"""Benchmark django-taskclaim on PostgreSQL against raw SQL and against peer task queues.

    python -m benchmarks --start-server                  # full run on a private server (fsync on)
    python -m benchmarks --pg-url postgresql://u@h/db    # full run on your server
    python -m benchmarks --start-server --smoke          # seconds: app and raw-SQL phases only

The run creates (and afterwards drops) its own database on the server, prints a table,
writes it to ``--out`` (default docs/benchmarks.md) and draws ``--chart`` (default
docs/benchmarks.png, needs matplotlib). The peers (procrastinate, django-tasks-db) are
measured when they import (``pip install django-taskclaim[bench]``); ``--smoke`` never runs
them. Phases:

1. by-key claim + complete, app vs the same SQL sent with plain psycopg, W = 1, 2, 4, 8;
2. queue drain (complete_and_claim_next) of 5,000 no-op tasks, W = 1, 2, 4, vs the commit limit
   and the peers at their best (procrastinate at each concurrency, django-tasks-db with each
   queue filter; persistent connections for both Django-based systems);
3. claim latency with 10 thousand, 1 million and 10 million finished rows in the table, tasks spread
   over 8 queues and five priorities: by key, ``claim_next`` on one queue, and on all eight at once;
4. contention: 32 processes racing on each of 500 keys, vs the bare claim statement's race;
5. the cost of the attempt audit trail (TASKCLAIM_AUDIT on vs off);
6. the outbox (``outbox``): a drain with and without one ``claim.outbox.http()`` message per task
   (one more row in the completion's commit), and W = 4 relays delivering them to a no-op HTTP
   endpoint (benchmarks/outbox_phase.py);
7. the Django Tasks API (``tasks``): 5,000 no-op tasks enqueued with ``Task.enqueue()`` and drained
   by 4 worker processes, and 10,000 enqueues in one transaction (``Task.enqueue()`` and each
   system's bulk call): django_taskclaim.tasks.ClaimBackend (``taskclaim_worker``, ``enqueue_many``)
   vs django-tasks-db (Python 3.11, Django 5.2) and django-ox (Python 3.12, Django 6.1), each peer
   in its own virtualenv, made on first use (``--smoke`` runs this phase only when ``--phases``
   names it);
7. enqueue-to-start latency on an idle system (``latency``), p50 and p99: one worker per system at its
   defaults, tasks enqueued one at a time by another process (``benchmarks.latency``; not in ``--smoke``
   unless ``--phases`` names it).
8. I/O-bound work (``iodrain``): 5,000 tasks that each wait 50 ms (``time.sleep``, and
   ``asyncio.sleep``) drained by 2 worker processes × 32 tasks in flight, ``taskclaim_worker
   --concurrency 32`` vs django-ox's ``ox_worker --concurrency 32``, and ours against the ideal
   min(2 × 32 / 50 ms, its own no-op drain at 2 × 32); then one worker process with 500 async tasks
   in flight: memory per task, and the statements per second on its task table (the lease
   renewals; counted by ``pg_stat_statements``, which ``--start-server`` loads for this phase).
   Not in ``--smoke`` unless ``--phases`` names it.
9. durable steps (``steps``): a taken-over task's stored steps asked for again: the statements of a
   stored step (target ≤ 1), a stored step's time against a dict lookup, the first (the one read)
   and a new step's insert against ``claim.check()`` (benchmarks/steps_phase.py).

Every comparison runs 3 interleaved rounds; each target is the lowest of its per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .results import APP_DRAIN, RAW_BATCH_DRAIN, RAW_DRAIN, SMOKE, WORKER_BATCH, WORKER_DRAIN, Results, Sizes

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("bykey", "drain", "size", "race", "audit", "tasks", "latency", "outbox", "iodrain", "steps")
#: Phases a --smoke run leaves out unless --phases names them: they make or use the peers' virtualenvs.
NOT_IN_SMOKE = ("tasks", "latency", "iodrain")
TASK = "django_taskclaim_task"
ATTEMPT = "django_taskclaim_attempt"
STEP = "django_taskclaim_step"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def rate(results: list[dict[str, Any]], count: int) -> float:
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    return count / span


class Bench:
    def __init__(self, url: str, sizes: Sizes, run_peers: bool, private_server: bool = False) -> None:
        self.url = url
        self.private_server = private_server  # started by this run (--start-server): ours to configure
        self.sizes = sizes
        self.run_peers = run_peers and sizes.peers
        self.tasks_peers = run_peers  # the Django Tasks phase measures peers in smoke size too
        self.results = Results()

    # -- plumbing ---------------------------------------------------------------------------
    def sql(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def _keys(self) -> int:
        return int(self.sql(f"SELECT count(*) FROM {TASK}")[0][0])

    def clear(self) -> None:
        self.sql(f"TRUNCATE {STEP}, {ATTEMPT}, {TASK} RESTART IDENTITY")

    def pending_progress(self, label: str, total: int) -> Any:
        def show() -> None:
            left = self.sql(f"SELECT count(*) FROM {TASK} WHERE status = 'pending'")[0][0]
            log(f"  {label}: {total - left:,}/{total:,} done")
        return show

    # -- environment ------------------------------------------------------------------------
    def describe(self, args: argparse.Namespace) -> None:
        import django

        from .peers import version

        env = self.results.env
        env["machine"] = f"{os.cpu_count()} CPU(s) (nproc), {_memory()} RAM, {platform.platform()}"
        env["cpu"] = _cpu_model()
        env["load average at start (1/5/15 min)"] = _loadavg()
        env["python"] = platform.python_version()
        env["django"] = django.get_version()
        for dist in ("django-taskclaim", "psycopg", "procrastinate", "django-tasks-db", "django-tasks"):
            env[dist] = version(dist)
        env["postgresql"] = self.sql("SHOW server_version")[0][0]
        env["pg settings"] = ", ".join(
            f"{name}={self.sql(f'SHOW {name}')[0][0]}"
            for name in ("fsync", "synchronous_commit", "full_page_writes", "shared_buffers", "max_connections")
        )
        env["command"] = "python -m benchmarks " + " ".join(args.argv)

    # -- phases ------------------------------------------------------------------------------
    def bykey(self) -> None:
        from .workers import bykey_app, bykey_minimal, bykey_raw, run_workers

        s = self.sizes
        for w in s.bykey_workers:
            # Interleaved rounds, best of each: other load on a shared machine only slows a run down.
            for n in range(s.rounds):
                for system in ("minimal", "raw", "app", "app_noaudit"):
                    self.clear()
                    run = f"bk-{system}-{w}-{n}"
                    if system.startswith("app"):
                        out = run_workers(bykey_app, w, (run, s.bykey_seconds, system == "app"))
                    elif system == "raw":
                        out = run_workers(bykey_raw, w, (run, s.bykey_seconds, True, self.url))
                    else:
                        out = run_workers(bykey_minimal, w, (run, s.bykey_seconds, self.url))
                    value = rate(out, sum(r["count"] for r in out))
                    self.results.bykey[system][w] = max(value, self.results.bykey[system].get(w, 0.0))
                    self.results.bykey_runs.setdefault(system, {}).setdefault(w, []).append(value)
                    log(f"  by-key {system:7} W={w} round {n + 1}/{s.rounds}: {value:,.0f} claim+complete/s")

    def drain(self) -> None:
        """For each W, every system in turn (so that load from elsewhere hits them alike)."""
        s = self.sizes
        systems: list[tuple[str, Any]] = [
            (APP_DRAIN, self._drain_taskclaim),
            (WORKER_DRAIN, lambda w: self._drain_taskclaim(w, batch=WORKER_BATCH)),
            (RAW_DRAIN, lambda w: self._drain_taskclaim(w, raw=True)),
            (RAW_BATCH_DRAIN, lambda w: self._drain_taskclaim(w, raw=True, batch=WORKER_BATCH)),
        ]
        if self.run_peers:
            from . import peers

            have = peers.available()
            if have["procrastinate"]:
                peers.procrastinate_setup(self.url)
                for c in s.procrastinate_concurrency:
                    systems.append((f"procrastinate (concurrency {c})",
                                    lambda w, c=c: self._drain_procrastinate(w, c)))
            else:
                log("  procrastinate is not installed: skipped (pip install django-taskclaim[bench])")
            if have["django-tasks-db"]:
                for queues in s.dtdb_queues:
                    systems.append((f"django-tasks-db ({queues} queue{'s' if queues == 'all' else ''})",
                                    lambda w, queues=queues: self._drain_dtdb(w, queues)))
            else:
                log("  django-tasks-db is not installed: skipped (pip install django-taskclaim[bench])")
        for name, _ in systems:
            self.results.drain[name], self.results.duplicates[name] = {}, {}
            self.results.drain_runs[name] = {}
        for w in s.drain_workers:
            # Rounds interleaved across systems, so that load from elsewhere hits them alike; the
            # best round is each system's figure, and every round is kept for the spread.
            for n in range(s.rounds):
                for name, drain in systems:
                    executed, value = drain(w)
                    self._check(name, w, executed, s.drain_tasks)
                    self.results.drain_runs[name].setdefault(w, []).append(value)
                    self.results.drain[name][w] = max(value, self.results.drain[name].get(w, 0.0))
                    log(f"  drain {name} W={w} round {n + 1}/{s.rounds}: {value:,.0f} tasks/s")

    def _drain_taskclaim(self, w: int, raw: bool = False, batch: int = 1) -> tuple[list[Any], float]:
        """The one-task loop (``batch`` 1) or the worker helper ``work(batch=…)``; ``raw``: the same
        statements in plain psycopg (the commit limit)."""
        from .workers import drain_app, drain_raw, drain_worker, run_workers

        n = self.sizes.drain_tasks
        self.clear()
        # Work for the workers' handler: pending in the default queue, no task path.
        self.insert_tasks("'drain:' || g", "'pending'", "'default'", "0", "NULL", 1, n)
        self.sql(f"VACUUM ANALYZE {TASK}")
        progress = self.pending_progress(f"{'raw' if raw else 'taskclaim'} batch {batch} W={w}", n)
        if raw:
            out = run_workers(drain_raw, w, (True, self.url, batch), progress=progress)
        elif batch > 1:
            out = run_workers(drain_worker, w, (batch,), progress=progress)
        else:
            out = run_workers(drain_app, w, (True,), progress=progress)
        done = self.sql(f"SELECT count(*) FROM {TASK} WHERE status = 'succeeded'")[0][0]
        if done != n:
            raise RuntimeError(f"taskclaim drain W={w}: {done} tasks succeeded, expected {n}")
        return [e for r in out for e in r["executed"]], rate(out, n)

    def _drain_procrastinate(self, w: int, c: int) -> tuple[list[Any], float]:
        from . import peers
        from .workers import run_workers

        n = self.sizes.drain_tasks
        peers.procrastinate_fill(self.url, n)

        def show() -> None:
            log(f"  procrastinate c={c} W={w}: {n - peers.procrastinate_left(self.url)[0]:,}/{n:,} done")

        out = run_workers(peers.procrastinate_worker, w, (self.url, c), progress=show)
        left, done = peers.procrastinate_left(self.url)
        if left or done != n:
            raise RuntimeError(f"procrastinate c={c} W={w}: {left} jobs left, {done} succeeded")
        return [e for r in out for e in r["executed"]], rate(out, n)

    def _drain_dtdb(self, w: int, queues: str) -> tuple[list[Any], float]:
        from . import peers
        from .workers import run_workers

        n = self.sizes.drain_tasks
        peers.dtdb_fill(n)

        def show() -> None:
            log(f"  django-tasks-db W={w}: {n - peers.dtdb_left()[0]:,}/{n:,} done")

        out = run_workers(peers.dtdb_worker, w, (queues,), progress=show)
        left, done = peers.dtdb_left()
        if left or done != n:
            raise RuntimeError(f"django-tasks-db W={w}: {left} jobs left, {done} succeeded")
        return [e for r in out for e in r["executed"]], rate(out, n)

    def _check(self, system: str, w: int, executed: list[Any], n: int) -> None:
        duplicates = len(executed) - len(set(executed))
        self.results.duplicates.setdefault(system, {})[w] = duplicates
        if len(set(executed)) != n:
            raise RuntimeError(f"{system} W={w}: {len(set(executed))} distinct jobs executed, expected {n}")

    def insert_tasks(self, key: str, status: str, queue: str, priority: str, run_after: str, first: int,
                     last: int) -> None:
        """Insert task rows ``first``…``last`` of ``generate_series`` (``g``) in one statement: each
        argument but the bounds is the SQL of a column's value, in terms of ``g``. Finished rows are
        completed attempts of work for a handler (no task path); pending ones never claimed."""
        done = status != "'pending'"
        held, result = ("'generated', 1, 1", "'null'::jsonb") if done else ("'', 0, 0", "NULL")
        self.sql(
            f'INSERT INTO {TASK} (tenant, "key", status, owner, fencing_token, attempts, max_attempts, '
            f"payload_fingerprint, result, result_ref, error, created_at, updated_at, queue, priority, run_after, "
            f"task_path) SELECT '', {key}, {status}, {held}, 5, '', {result}, '', '', now(), now(), {queue}, "
            f"{priority}, {run_after}, '' FROM generate_series(%s::bigint, %s::bigint) g",
            [first, last],
        )

    def table_size(self) -> None:
        """By-key and queue claims with 10 thousand to 10 million finished rows in the table.

        The finished rows are spread over ``Sizes.size_queues`` queues and five priorities (one in
        ten claimed by key: no queue); so are the pending tasks the queue claims take, with a few
        deferred ones (a retry waiting for its backoff) among them that every claim passes over.
        ``claim_next`` is timed on one queue at a time (each in turn) and on all of them at once.
        """
        from .workers import latency, run_workers

        s = self.sizes
        queues = [f"q{i}" for i in range(s.size_queues)]
        nq = self.results.size_queues = len(queues)
        queue_of, priority_of = f"'q' || (g %% {nq})", f"((g / {nq}) %% 5) * 10 - 20"  # -20 … 20
        self.clear()
        have = 0
        for rows in s.table_rows:
            started = time.perf_counter()
            step = 1_000_000
            while have < rows:
                upto = min(rows, have + step)
                self.insert_tasks("'done:' || g", "'succeeded'", f"CASE WHEN g %% 10 = 0 THEN NULL ELSE {queue_of} END",
                                  priority_of, "NULL", have + 1, upto)
                have = upto
                if rows >= step:
                    log(f"  table size: {have:,}/{rows:,} finished rows generated")
            # Deferred tasks, 25 a queue at every priority: not due for a day, so every claim of
            # their queue passes over those above the ones it takes.
            self.insert_tasks(f"'deferred:{rows}:' || g", "'pending'", queue_of, priority_of,
                              "now() + interval '1 day'", 1, 25 * nq)
            self.sql(f"VACUUM ANALYZE {TASK}")
            self.sql(f"VACUUM ANALYZE {ATTEMPT}")
            self.results.fill_seconds[rows] = time.perf_counter() - started
            runs = self.results.size_runs[rows] = []
            for n in range(s.rounds):
                # Fresh pending tasks for each round, as many for one queue at a time as for all queues.
                self.insert_tasks(f"'queued:{rows}:{n}:' || g", "'pending'", queue_of, priority_of, "NULL", 1,
                                  2 * s.latency_samples)
                (out,) = run_workers(latency, 1, (f"size-{rows}-{n}", s.latency_samples, queues))
                runs.append({f"{kind}_{q}": pct(out[kind], int(q[1:]))
                             for kind in ("bykey", "queue", "queues") for q in ("p50", "p99")})
            self.sql(f"DELETE FROM {TASK} WHERE status = 'pending'")  # the deferred ones
            # Each figure the best (lowest) of the rounds: other load only ever slows a round down.
            self.results.sizes[rows] = {k: min(run[k] for run in runs) for k in runs[0]}
            r = self.results.sizes[rows]
            log(f"  {rows:,} rows: by-key claim p50 {r['bykey_p50'] * 1e3:.3f} ms p99 {r['bykey_p99'] * 1e3:.3f} ms; "
                f"claim_next one queue p50 {r['queue_p50'] * 1e3:.3f} ms p99 {r['queue_p99'] * 1e3:.3f} ms; "
                f"{nq} queues p50 {r['queues_p50'] * 1e3:.3f} ms p99 {r['queues_p99'] * 1e3:.3f} ms "
                f"(generated in {self.results.fill_seconds[rows]:.0f} s)")
        self.clear()
        self.sql(f"VACUUM {TASK}")

    def contention(self) -> None:
        from .workers import CTX, race, race_raw, run_workers

        s = self.sizes
        self.results.race["racers"] = s.racers
        rounds_of = [(n, label, racers) for n in range(s.rounds)
                     for label, racers in (("uncontended", 1), ("contended", s.racers),
                                           ("raw_uncontended", 1), ("raw_contended", s.racers))]
        for n, label, racers in rounds_of:
            self.clear()
            rounds = CTX.Barrier(racers)

            def show(label: str = label) -> None:
                log(f"  {label}: {self._keys():,}/{s.race_keys:,} keys")

            if label.startswith("raw_"):
                # A raw loser may be told "nothing claimed" by a statement whose snapshot predates
                # the winner's insert; it is still a loser, so the one-winner check holds.
                out = run_workers(race_raw, racers, (f"{label}-{n}", s.race_keys, rounds, self.url), progress=show)
            else:
                out = run_workers(race, racers, (f"{label}-{n}", s.race_keys, rounds), progress=show)
            winners = sorted(k for r in out for k in r["won"])
            if winners != list(range(s.race_keys)):
                raise RuntimeError(f"{label}: expected one winner per key, got {len(winners)} wins "
                                   f"for {len(set(winners))} keys")
            times = [t for r in out for t in r["times"]]
            self.results.race_runs.setdefault(label, []).append((pct(times, 50), pct(times, 99)))
            # The best (lowest) round of each: other load only ever slows a round down.
            self.results.race[f"{label}_p50"] = min(p50 for p50, _ in self.results.race_runs[label])
            self.results.race[f"{label}_p99"] = min(p99 for _, p99 in self.results.race_runs[label])
            if label == "contended" and n == 0:
                dup = self.sql(f"SELECT count(*) FROM {ATTEMPT} WHERE outcome = 'duplicate'")[0][0]
                self.results.race["duplicates_recorded"] = dup
                self.results.race["duplicates_expected"] = (racers - 1) * s.race_keys
            p50, p99 = self.results.race_runs[label][-1]
            log(f"  {label} ({racers} process(es) × {s.race_keys} keys) round {n + 1}/{s.rounds}: decision p50 "
                f"{p50 * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms")

    def tasks_api(self) -> None:
        from . import tasks_phase

        tasks_phase.run(self.url, self.sizes, self.results.tasks, peers=self.tasks_peers, log=log)

    def latency(self) -> None:
        from . import latency

        latency.run(self.url, self.sizes.idle_samples, self.results.idle, peers=self.tasks_peers, log=log)

    def outbox(self) -> None:
        from . import outbox_phase

        outbox_phase.run(self, log)

    def iodrain(self) -> None:
        from . import iodrain_phase

        iodrain_phase.run(self.url, self.sizes, self.results.iodrain, peers=self.tasks_peers,
                          private_server=self.private_server, log=log)

    def steps(self) -> None:
        from . import steps_phase

        steps_phase.run(self, log)

    def audit(self) -> None:
        from .workers import bykey_app, run_workers

        s = self.sizes
        for n in range(s.rounds):
            for audit in (True, False):
                self.clear()
                run = f"audit-{audit}-{n}"
                out = run_workers(bykey_app, s.audit_workers, (run, s.audit_seconds, audit))
                key = "on" if audit else "off"
                value = rate(out, sum(r["count"] for r in out))
                self.results.audit[key] = max(value, self.results.audit.get(key, 0.0))
                log(f"  audit {key} round {n + 1}/{s.rounds}: {value:,.0f} claim+complete/s (W={s.audit_workers})")


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


def _steal() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs since boot: time a hypervisor gave to other guests."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (values[7] if len(values) > 7 else 0), sum(values)


def _steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[1] == before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def _busy_elsewhere(window: float = 1.0) -> str | None:
    """Why this machine looks too busy to conclude, or ``None``.

    Sampled between phases, while this script and its workers do nothing: whatever keeps the
    CPUs busy then is other work that will compete with the measured processes. More than a
    quarter of the machine busy for the ``window`` makes the run's figures inconclusive.
    """
    before = _cpu_times()
    time.sleep(window)  # a measurement window, not a synchronisation
    after = _cpu_times()
    if before is None or after is None or after[1] == before[1]:
        return None
    busy = (after[0] - before[0]) / (after[1] - before[1])
    if busy > 0.25:
        return (f"{busy:.0%} of the CPUs were busy with other work while the benchmark was idle: "
                f"the figures of this run are not conclusive")
    return None


def _loadavg() -> str:
    try:
        return " / ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def _memory() -> str:
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        return f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        return "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def create_database(maintenance_url: str, name: str) -> str:
    import psycopg
    from psycopg import sql

    with psycopg.connect(maintenance_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    parts = urlsplit(maintenance_url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def drop_database(maintenance_url: str, name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(maintenance_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--pg-url", help="PostgreSQL server to use (any database on it; the run creates its own)")
    where.add_argument("--start-server", action="store_true",
                       help="start a private PostgreSQL on 127.0.0.1 with fsync=on and full_page_writes=on")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, app and raw-SQL phases only, no peers: seconds (used by CI)")
    parser.add_argument("--no-peers", action="store_true", help="skip procrastinate and django-tasks-db")
    parser.add_argument("--max-rows", type=int, default=None,
                        help="largest table size of the latency phase (default: 10,000,000; smoke 10,000)")
    parser.add_argument("--drain-tasks", type=int, default=None,
                        help="tasks drained per system and W (default: 5,000; smoke 300)")
    parser.add_argument("--tasks-drain", type=int, default=None,
                        help="tasks drained per system in the Django Tasks phase (default: 5,000; smoke 100)")
    parser.add_argument("--io-tasks", type=int, default=None,
                        help="tasks drained per system and kind in the I/O-bound phase (default: 5,000; smoke 200)")
    parser.add_argument("--io-concurrency", type=int, default=None,
                        help="tasks in flight per worker process in the I/O-bound drain (default: 32)")
    parser.add_argument("--db-name", default="taskclaim_bench",
                        help="database created (dropped first) for the run (default: %(default)r)")
    parser.add_argument("--keep-db", action="store_true", help="do not drop the database at the end")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"),
                        help="Markdown report (default: docs/benchmarks.md); '-' for none")
    parser.add_argument("--chart", default=str(ROOT / "docs" / "benchmarks.png"),
                        help="PNG chart (default: docs/benchmarks.png); '-' for none")
    parser.add_argument("--phases", default=None,
                        help=f"comma-separated subset of {','.join(PHASES)} (default: all; with --smoke all "
                             f"but {' and '.join(NOT_IN_SMOKE)})")
    args = parser.parse_args(argv)
    args.argv = argv
    if args.max_rows is not None and args.max_rows < 1:
        parser.error("--max-rows must be positive")
    if args.drain_tasks is not None and args.drain_tasks < 1:
        parser.error("--drain-tasks must be positive")
    if args.tasks_drain is not None and args.tasks_drain < 1:
        parser.error("--tasks-drain must be positive")
    if args.io_tasks is not None and args.io_tasks < 1:
        parser.error("--io-tasks must be positive")
    if args.io_concurrency is not None and args.io_concurrency < 1:
        parser.error("--io-concurrency must be positive")
    if args.phases is None:
        args.phases = ",".join(p for p in PHASES if not (args.smoke and p in NOT_IN_SMOKE))
    unknown = set(args.phases.split(",")) - set(PHASES)
    if unknown:
        parser.error(f"unknown phase(s): {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sizes = SMOKE if args.smoke else Sizes()
    if args.drain_tasks is not None:
        sizes.drain_tasks = args.drain_tasks
    if args.tasks_drain is not None:
        sizes.tasks_drain = args.tasks_drain
    if args.io_tasks is not None:
        sizes.io_tasks = args.io_tasks
    if args.io_concurrency is not None:
        sizes.io_concurrency = args.io_concurrency
    if args.max_rows is not None:
        sizes.table_rows = tuple(r for r in sizes.table_rows if r < args.max_rows) + (args.max_rows,)
    server = None
    if args.start_server:
        sys.path.insert(0, str(ROOT))
        from devtools.servers import PostgresServer

        settings = {"fsync": "on", "full_page_writes": "on"}
        if "iodrain" in args.phases.split(","):
            # Its workers hold many tasks (and connections) at once, and it counts their statements:
            # pg_stat_statements loaded, tracking off but for the database it measures, and then
            # only while it measures (benchmarks/iodrain_phase.py).
            settings.update({"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "none",
                             "max_connections": str(max(300, 2 * sizes.io_inflight + 100))})
        server = PostgresServer(settings=settings).start()
        log(f"started PostgreSQL on 127.0.0.1:{server.port} ({', '.join(f'{k}={v}' for k, v in settings.items())})")
        maintenance = server.url
    else:
        maintenance = args.pg_url
    try:
        url = create_database(maintenance, args.db_name)
        try:
            return run(args, sizes, url)
        finally:
            if not args.keep_db:
                drop_database(maintenance, args.db_name)
    finally:
        if server is not None:
            server.stop()


def run(args: argparse.Namespace, sizes: Sizes, url: str) -> int:
    os.environ["TASKCLAIM_BENCH_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    call_command("migrate", verbosity=0)
    connections.close_all()

    from . import report
    from .workers import check_identical_sql

    bench = Bench(url, sizes, run_peers=not args.no_peers, private_server=args.start_server)
    bench.describe(args)
    checked = check_identical_sql(url)
    connections.close_all()
    log(f"raw phase sends the app's SQL: {checked} statements compared, identical")
    phases = args.phases.split(",")
    for name, method, title in (
        ("bykey", bench.bykey, "by-key claim + complete, app vs raw SQL"),
        ("drain", bench.drain, f"queue drain of {sizes.drain_tasks:,} no-op tasks"),
        ("size", bench.table_size, "claim latency by table size"),
        ("race", bench.contention, f"contention: {sizes.racers} processes × {sizes.race_keys} keys"),
        ("audit", bench.audit, "attempt audit trail on vs off"),
        ("outbox", bench.outbox, f"outbox: a drain of {sizes.outbox_tasks:,} tasks with and without a message "
                                 f"each, then {sizes.outbox_workers} relays"),
        ("tasks", bench.tasks_api, f"Django Tasks API: drain of {sizes.tasks_drain:,} tasks at "
                                   f"W={sizes.tasks_workers}, bulk enqueue of {sizes.tasks_bulk:,}"),
        ("latency", bench.latency, f"enqueue-to-start latency on an idle system, {sizes.idle_samples} tasks"),
        ("steps", bench.steps, "durable steps: statements and time of a step already stored"),
        ("iodrain", bench.iodrain, f"I/O-bound drain of {sizes.io_tasks:,} tasks of {sizes.io_wait * 1e3:g} ms at "
                                   f"{sizes.io_workers} × {sizes.io_concurrency} in flight, {sizes.io_inflight} "
                                   "tasks in flight in one worker"),
    ):
        if name not in phases:
            continue
        log(f"phase: {title}")
        busy = _busy_elsewhere()
        if busy:
            bench.results.warnings.append(f"before phase {name}: {busy}")
            log(f"  WARNING: {busy}")
        started, steal = time.perf_counter(), _steal()
        method()
        bench.results.phase_seconds[name] = time.perf_counter() - started
        stolen = _steal_share(steal, _steal())
        if stolen is not None and stolen > 0.05:
            note = (f"during phase {name}: the hypervisor held back {stolen:.0%} of the CPU time (steal): "
                    f"the figures of this run are not conclusive")
            bench.results.warnings.append(note)
            log(f"  WARNING: {note}")
        busy = _busy_elsewhere()
        if busy:
            bench.results.warnings.append(f"after phase {name}: {busy}")
            log(f"  WARNING: {busy}")
    bench.results.env["load average at end (1/5/15 min)"] = _loadavg()
    text = report.markdown(bench.results, sizes, smoke=args.smoke)
    print(text, flush=True)
    if args.out != "-":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        log(f"wrote {args.out}")
    if args.chart != "-":
        if report.chart(bench.results, args.chart):
            log(f"wrote {args.chart}")
        else:
            log("matplotlib is not installed: no chart (pip install django-taskclaim[bench])")
    return 0


if __name__ == "__main__":
    sys.exit(main())
