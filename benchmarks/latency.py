"""The latency phase: how long a task enqueued on an idle system waits before it starts, p50 and
p99, for django-taskclaim and its peers on PostgreSQL, each with its own worker at its defaults.

One worker process per system waits for work; another process enqueues a task, waits until the
task has recorded its start, pauses 50–150 ms, and enqueues the next
(``benchmarks.tasks_runner SYSTEM latency N``). The Django Tasks systems (ours: ``taskclaim_worker``,
woken by ``LISTEN``/``NOTIFY``; django-ox: ``ox_worker``) run in their own interpreters as in the
Django Tasks phase; procrastinate (``run_worker``, which listens too) in a virtualenv of its own,
``.venv-bench-procrastinate``, made on first use.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

from .tasks_phase import READY_TIMEOUT, Runner, await_ready, finish, stop
from .tasks_systems import OURS, OX, QUEUE, SYSTEMS, Venv
from .tasks_venvs import ROOT, Unavailable, ensure

#: procrastinate's own virtualenv, made on first use (the benchmark's environment may lack it).
PROCRASTINATE = Venv(".venv-bench-procrastinate", "3.11", ("procrastinate>=3.10,<4", "psycopg[binary]>=3.1"))
PROCRASTINATE_LABEL = "procrastinate (run_worker, concurrency 1)"

#: The worker each system runs: its own command, at its defaults (one task at a time).
WORKERS: dict[str, tuple[str, ...]] = {
    OURS: ("taskclaim_worker", "--queue", QUEUE),
    OX: ("ox_worker", "--concurrency", "1"),
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def run(url: str, samples: int, results: dict[str, Any], *, peers: bool, log: Callable[[str], None]) -> None:
    """Measure each system that runs here; ``results``: ``latencies`` (label -> seconds), ``skipped``
    (label -> why), ``versions``."""
    runner = Runner(url, log)
    results.setdefault("latencies", {})
    results.setdefault("skipped", {})
    for key in (OURS, OX):
        system = SYSTEMS[key]
        label = f"{system.name} ({' '.join(WORKERS[key])})"
        if key != OURS and not peers:
            results["skipped"][label] = "--no-peers"
            continue
        with tempfile.TemporaryDirectory(prefix="taskclaim-latency-") as stamps:
            runner.env.update(TASKCLAIM_BENCH_IDLE="1", TASKCLAIM_BENCH_STAMPS=stamps)
            found = runner.setup(system)
            why = found.pop("error", None)
            if why:
                results["skipped"][label] = why
                log(f"  latency {label}: not measured: {why}")
                continue
            results.setdefault("versions", {})[key] = found
            runner.call(key, "prepare", "0")
            proc, err = runner.start(key, "worker", *WORKERS[key])
            try:
                await_ready(proc, err, label, time.monotonic() + READY_TIMEOUT)
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
                got = runner.call(key, "latency", str(samples), timeout=120 + samples * 2)["latencies"]
            finally:
                stop(proc, err)
        results["latencies"][label] = got
        log(f"  latency {label}: p50 {percentile(got, 50) * 1000:.1f} ms, p99 {percentile(got, 99) * 1000:.1f} ms "
            f"({len(got)} tasks)")
    if peers:
        _procrastinate(runner, samples, results, log)
    else:
        results["skipped"][PROCRASTINATE_LABEL] = "--no-peers"


def _procrastinate(runner: Runner, samples: int, results: dict[str, Any], log: Callable[[str], None]) -> None:
    try:
        python = str(ensure(PROCRASTINATE, log))
    except Unavailable as exc:
        results["skipped"][PROCRASTINATE_LABEL] = str(exc)
        log(f"  latency {PROCRASTINATE_LABEL}: not measured: {exc}")
        return

    def start(*args: str) -> tuple[subprocess.Popen[str], Any]:
        err = tempfile.TemporaryFile("w+")  # noqa: SIM115  (closed by stop(), with the process)
        proc = subprocess.Popen([python, "-m", "benchmarks.procrastinate_latency", *args], cwd=ROOT, env=runner.env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
        return proc, err

    def call(*args: str, timeout: float) -> dict[str, Any]:
        proc, err = start(*args)
        try:
            return finish(proc, err, f"procrastinate {' '.join(args)}", time.monotonic() + timeout)
        finally:
            stop(proc, err)

    with tempfile.TemporaryDirectory(prefix="taskclaim-latency-") as stamps:
        runner.env["TASKCLAIM_BENCH_STAMPS"] = stamps
        results.setdefault("versions", {})["procrastinate"] = call("setup", timeout=120)
        proc, err = start("worker")
        try:
            await_ready(proc, err, PROCRASTINATE_LABEL, time.monotonic() + READY_TIMEOUT)
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
            got = call("latency", str(samples), timeout=120 + samples * 2)["latencies"]
        finally:
            stop(proc, err)
    results["latencies"][PROCRASTINATE_LABEL] = got
    log(f"  latency {PROCRASTINATE_LABEL}: p50 {percentile(got, 50) * 1000:.1f} ms, "
        f"p99 {percentile(got, 99) * 1000:.1f} ms ({len(got)} tasks)")


def report(results: dict[str, Any]) -> list[str]:
    """The Markdown section: p50, p99 and each peer's over ours."""
    latencies: dict[str, list[float]] = results.get("latencies", {})
    if not latencies:
        return []
    lines = ["## Enqueue-to-start latency on an idle system (PostgreSQL)", "",
             "One worker process per system at its defaults waits for work; another process enqueues one task, "
             "waits for it to record its start, pauses 50–150 ms and enqueues the next. Latency: from just "
             "before `enqueue()` (which commits) to the task's own recorded start.", "",
             "| system | tasks | p50 | p99 | p50 / ours | p99 / ours |", "|---|---:|---:|---:|---:|---:|"]
    ours = next((v for k, v in latencies.items() if k.startswith(SYSTEMS[OURS].name)), None)
    for label, values in latencies.items():
        p50, p99 = percentile(values, 50), percentile(values, 99)
        ratios = ("", "") if ours is None else (f"{p50 / percentile(ours, 50):.1f}×",
                                                f"{p99 / percentile(ours, 99):.1f}×")
        lines.append(f"| {label} | {len(values)} | {p50 * 1000:.1f} ms | {p99 * 1000:.1f} ms "
                     f"| {ratios[0]} | {ratios[1]} |")
    lines.append("")
    for label, why in results.get("skipped", {}).items():
        lines.append(f"- {label}: not measured: {why}")
    lines.append("")
    return lines
