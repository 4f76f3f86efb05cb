"""The I/O-bound phase: tasks that wait (50 ms of ``time.sleep`` or of ``asyncio.sleep``, as a call
to a model or a remote service does) drained by W worker processes of C tasks in flight each,
django-taskclaim (``taskclaim_worker --concurrency C``) against django-ox (``ox_worker
--concurrency C``); then one worker process holding N tasks in flight at once: its memory per task
(RSS from ``/proc/PID/status``, loaded minus idle) and the statements per second that touch its
task table while they wait (``pg_stat_statements``), the lease renewals above all.

Each system runs its own worker command in child processes under its own interpreter, as in the
Django Tasks phase (``benchmarks.tasks_phase``, ``benchmarks.tasks_runner``). Interleaved rounds;
in each, ours also drains no-op tasks in the same configuration: the rate its commits allow,
which with min(W × C / wait) is the ideal the I/O-bound drain is held to.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from .results import IoResults, Sizes
from .tasks_phase import READY_TIMEOUT, Runner, await_ready, drain_with, finish, stop
from .tasks_systems import OURS, OX, SYSTEMS, System

#: The systems of the phase: ours and the one peer whose worker runs many tasks per process.
IO_SYSTEMS = (OURS, OX)
#: The kinds of waiting task drained (benchmarks.io_tasks.KINDS), and ours' ceiling: no-op tasks.
WAITING = ("sync", "async")
CEILING = "noop"
#: The pg_stat_statements setting the phase turns on for its own database while it counts.
TRACK = "pg_stat_statements.track"


def label(key: str, kind: str, sizes: Sizes) -> str:
    io = SYSTEMS[key].io
    assert io is not None
    what = {"noop": "no-op tasks", "sync": "time.sleep", "async": "asyncio.sleep"}[kind]
    return f"{SYSTEMS[key].name} ({io.command} {io.concurrency} {sizes.io_concurrency}, {what})"


def worker_args(system: System, concurrency: int, *, serve: bool = False,
                lease: float | None = None) -> tuple[str, ...]:
    """``manage.py COMMAND ARGS…`` of a worker of ``concurrency`` tasks in flight; ours at 1 without
    the option (what it does by default, and all it can do before issue 32)."""
    io = system.io
    assert io is not None
    args: tuple[str, ...] = (io.command, *(io.serve if serve else io.drain))
    if concurrency > 1 or system.key != OURS:
        args += (io.concurrency, str(concurrency))
    if lease is not None:
        args += (io.lease, f"{lease:g}")
    return args


def run(url: str, sizes: Sizes, results: IoResults, *, peers: bool, private_server: bool,
        log: Callable[[str], None]) -> None:
    """Measure every system of the phase this machine can run: the drains in ``sizes.rounds``
    interleaved rounds, then each system's tasks in flight."""
    runner = Runner(url, log)
    results.tasks, results.wait = sizes.io_tasks, sizes.io_wait
    results.workers, results.concurrency = sizes.io_workers, sizes.io_concurrency
    measured: list[str] = []
    for key in IO_SYSTEMS:
        why, many = _usable(runner, key, results, peers=peers)
        if not why and not many and sizes.io_concurrency > 1:
            why = _no_concurrency(key)
        if why:
            results.skipped[key] = why
            log(f"  {SYSTEMS[key].name}: not measured: {why}")
            continue
        if not many:
            results.inflight_skipped[key] = _no_concurrency(key)
        measured.append(key)
        for kind in ((CEILING,) if key == OURS else ()) + WAITING:
            results.system_of[label(key, kind, sizes)] = key
            results.kind_of[label(key, kind, sizes)] = kind
    for round_ in range(sizes.rounds):
        # Interleaved as in the other phases, each round starting with the next system.
        order = measured[round_ % len(measured):] + measured[:round_ % len(measured)] if measured else []
        for key in order:
            for name in [n for n, k in results.system_of.items() if k == key]:
                kind = results.kind_of[name]
                io = SYSTEMS[key].io
                assert io is not None
                task = (kind, json.dumps([] if kind == CEILING else [sizes.io_wait]), io.bulk)
                executed, value = drain_with(runner, key, name, worker_args(SYSTEMS[key], sizes.io_concurrency),
                                             sizes.io_workers, sizes.io_tasks, task)
                if len(set(executed)) != sizes.io_tasks:
                    raise RuntimeError(f"{name}: {len(set(executed))} distinct tasks executed, expected "
                                       f"{sizes.io_tasks}")
                results.duplicates[name] = results.duplicates.get(name, 0) + len(executed) - sizes.io_tasks
                results.drain_runs.setdefault(name, []).append(value)
                log(f"  iodrain {name} W={sizes.io_workers} round {round_ + 1}/{sizes.rounds}: {value:,.0f} tasks/s")
    results.inflight, results.lease, results.window = sizes.io_inflight, sizes.io_lease, sizes.io_window
    counter = Statements(url, private_server)
    results.statements_skipped = counter.unavailable or ""
    if counter.unavailable:
        log(f"  statements not counted: {counter.unavailable}")
    for key in [k for k in measured if k not in results.inflight_skipped]:
        try:
            inflight(runner, key, sizes, results, counter, log)
        except (RuntimeError, OSError) as exc:  # recorded and shown in the report, not hidden
            results.inflight_skipped[key] = str(exc).splitlines()[0]
            log(f"  {SYSTEMS[key].name}: tasks in flight not measured: {exc}")


def _usable(runner: Runner, key: str, results: IoResults, *, peers: bool) -> tuple[str | None, bool]:
    """Why system ``key`` cannot run here (``None``: it can), and whether its worker takes the
    option of many tasks in flight; its versions are recorded either way."""
    system = SYSTEMS[key]
    if key != OURS and not peers:
        return "--no-peers", False
    found = runner.setup(system)
    why = found.pop("error", None)
    results.versions[key] = {k: str(v) for k, v in found.items()}
    if why:
        return str(why), False
    io = system.io
    assert io is not None
    return None, io.concurrency in runner.call(key, "accepts", io.command, io.concurrency)["accepts"]


def _no_concurrency(key: str) -> str:
    io = SYSTEMS[key].io
    assert io is not None
    return (f"`{io.command}` has no `{io.concurrency}` option in this checkout (issue 32 item 1 is not merged): "
            "one task in flight per process is all it runs")


# -- tasks in flight -----------------------------------------------------------------------------

def rss_kib(pid: int) -> int:
    """The resident set of process ``pid`` (``VmRSS``, KiB)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise OSError(f"/proc/{pid}/status has no VmRSS line")


def _sample_rss(pid: int, seconds: float) -> list[int]:
    """RSS samples of ``pid`` over ``seconds`` (a measurement window, not a synchronisation)."""
    samples, end = [rss_kib(pid)], time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(0.25, max(0.0, end - time.monotonic())))
        samples.append(rss_kib(pid))
    return samples


def _count(url: str, table: str, status: str, started: str = "") -> int:
    """Rows of ``table`` in ``status`` (and, with ``started``, with that column above 0)."""
    import psycopg
    from psycopg import sql

    query = sql.SQL("SELECT count(*) FROM {} WHERE status = %s").format(sql.Identifier(table))
    if started:
        query = sql.SQL("{} AND {} > 0").format(query, sql.Identifier(started))
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, [status]).fetchone()
    return int(row[0]) if row else 0


def _await_count(url: str, table: str, status: str, want: int, deadline: float, proc: Any, what: str,
                 started: str = "") -> None:
    """Poll until ``want`` rows of ``table`` have ``status`` (and have started, by ``started``); an
    error if the worker exits first or the deadline passes."""
    have = -1
    while time.monotonic() < deadline:
        have = _count(url, table, status, started)
        if have == want:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: the worker exited with code {proc.returncode} with {have} tasks {status}")
        time.sleep(0.1)  # a poll of the database, bounded by the deadline
    raise RuntimeError(f"{what}: {have} tasks {status} at the deadline, expected {want}")


def inflight(runner: Runner, key: str, sizes: Sizes, results: IoResults, counter: Statements,
             log: Callable[[str], None]) -> None:
    """One worker process of ``sizes.io_inflight`` async tasks in flight: its RSS idle (after one
    task, code paths warm) and with every task waiting; the statements on its task table per second
    meanwhile."""
    system, n = SYSTEMS[key], sizes.io_inflight
    io = system.io
    assert io is not None
    what = f"{system.name} with {n} tasks in flight"
    gate = os.path.join(tempfile.mkdtemp(prefix="taskclaim-bench-gate-"), "open")
    # Ours polls at its default interval here (the drains look again after 0.01 s): a worker whose
    # slots are all taken is not charged the benchmark's eager poll.
    env = {"TASKCLAIM_BENCH_SETTINGS": json.dumps({"TASKCLAIM_POLL_INTERVAL": 0.5})}
    counter.track(True)
    runner.call(key, "prepare", "1", "async", json.dumps([0]), io.bulk)  # the warm-up task
    proc, err = runner.start(key, "worker", *worker_args(system, n, serve=True, lease=sizes.io_lease), env=env)
    try:
        await_ready(proc, err, what, time.monotonic() + READY_TIMEOUT)
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        _await_count(runner.url, io.table, io.succeeded, 1, time.monotonic() + 60, proc, what)
        idle = statistics.median(_sample_rss(proc.pid, 1.0))
        runner.call(key, "enqueue", str(n), "hold", json.dumps([gate, 300.0]), io.bulk)
        # Every task started, not only claimed: a reserved claim's start is not a statement of waiting.
        _await_count(runner.url, io.table, io.running, n, time.monotonic() + 60 + n / 10, proc, what, io.started)
        before = counter.snapshot(io.table)
        started = time.monotonic()
        loaded = max(_sample_rss(proc.pid, sizes.io_window))
        seconds = time.monotonic() - started
        after = counter.snapshot(io.table)
        still = _count(runner.url, io.table, io.running, io.started)
        if still != n:
            raise RuntimeError(f"{what}: {still} tasks in flight at the end of the window, expected {n}")
        with open(gate, "w"):
            pass  # the held tasks return
        proc.send_signal(signal.SIGTERM)
        out = finish(proc, err, what, time.monotonic() + 60 + n / 10)
    finally:
        stop(proc, err)
        counter.track(False)
        if os.path.exists(gate):
            os.unlink(gate)
        os.rmdir(os.path.dirname(gate))
    if len(out["executed"]) != n + 1:
        raise RuntimeError(f"{what}: {len(out['executed'])} executions, expected {n + 1}")
    results.memory[key] = {"idle_kib": idle, "loaded_kib": loaded, "per_task_kib": (loaded - idle) / n}
    log(f"  {what}: RSS {idle / 1024:,.1f} MiB idle, {loaded / 1024:,.1f} MiB loaded: "
        f"{(loaded - idle) / n:,.1f} KiB per task in flight")
    if not counter.unavailable:
        rates: dict[str, float] = {}
        for qid, (calls, query) in after.items():
            delta = calls - before.get(qid, (0, query))[0]
            if delta > 0:
                rates[query] = rates.get(query, 0.0) + delta / seconds
        results.statements[key] = dict(sorted(rates.items(), key=lambda item: -item[1]))
        log(f"  {what}: {sum(rates.values()):,.2f} statements/s on {io.table} over {seconds:.1f} s "
            f"(lease {sizes.io_lease:g} s; one heartbeat per task would be {n / (sizes.io_lease / 3):,.0f}/s)")


class Statements:
    """Statements per query on a table, from ``pg_stat_statements``: on a private server
    (``--start-server`` loads it with tracking off) tracking is turned on for the benchmark's
    database while a worker is measured; elsewhere it is used when the server already tracks."""

    def __init__(self, url: str, private_server: bool) -> None:
        self.url, self.private = url, private_server
        self.unavailable = self._why_not()

    def _sql(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def _why_not(self) -> str | None:
        loaded = self._sql("SELECT current_setting('shared_preload_libraries')")[0][0]
        if "pg_stat_statements" not in loaded:
            return ("pg_stat_statements is not in the server's shared_preload_libraries (`--start-server` loads "
                    "it)")
        self._sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        if not self.private and self._sql(f"SELECT current_setting('{TRACK}')")[0][0] == "none":
            return f"the server's {TRACK} is 'none'"
        return None

    def track(self, on: bool) -> None:
        """Count the statements of sessions that start from now on in this database (private server)."""
        if self.unavailable or not self.private:
            return
        from psycopg import sql

        name = sql.Identifier(self._sql("SELECT current_database()")[0][0])
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            if on:
                conn.execute(sql.SQL("ALTER DATABASE {} SET pg_stat_statements.track = 'top'").format(name))
            else:
                conn.execute(sql.SQL("ALTER DATABASE {} RESET pg_stat_statements.track").format(name))

    def snapshot(self, table: str) -> dict[int, tuple[int, str]]:
        """queryid -> (calls, normalised text) of this database's statements that name ``table``."""
        if self.unavailable:
            return {}
        rows = self._sql("SELECT queryid, calls, query FROM pg_stat_statements WHERE dbid = "
                         "(SELECT oid FROM pg_database WHERE datname = current_database()) AND query LIKE %s",
                         [f"%{table}%"])
        return {int(qid): (int(calls), " ".join(str(query).split())) for qid, calls, query in rows}
