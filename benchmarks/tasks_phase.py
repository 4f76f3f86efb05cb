"""The Django Tasks phase: no-op tasks enqueued through ``Task.enqueue()`` and drained by each
system's own worker command in W processes, and 10,000 enqueues in one transaction.

Every system runs in child processes (``benchmarks.tasks_runner``) under its own interpreter:
the peers in their own virtualenvs (``benchmarks.tasks_venvs``), ours in the benchmark's. The
workers are started, wait until all are ready, and are released together; a drain's rate is the
task count over the span from the first start to the last exit, as in the queue-drain phase.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import IO, Any

from .results import Sizes, TasksResults
from .tasks_runner import READY, RESULT
from .tasks_systems import OURS, PEERS, SYSTEMS, System
from .tasks_venvs import ROOT, Unavailable, ensure

READY_TIMEOUT = 300.0


class Runner:
    """Starts the runner's steps for the systems this machine can run, and keeps their interpreters."""

    def __init__(self, url: str, log: Callable[[str], None]) -> None:
        self.url, self.log = url, log
        self.python: dict[str, str] = {}
        self.env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV")}
        self.env["TASKCLAIM_BENCH_URL"] = url

    def start(self, key: str, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], IO[str]]:
        """A step in a child process; ``env``: variables besides the runner's."""
        err = tempfile.TemporaryFile("w+")  # noqa: SIM115  (closed by stop(), with the process)
        proc = subprocess.Popen([self.python[key], "-m", "benchmarks.tasks_runner", key, *args], cwd=ROOT,
                                env={**self.env, **(env or {})}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, text=True)
        return proc, err

    def call(self, key: str, *args: str, timeout: float = 600.0) -> dict[str, Any]:
        proc, err = self.start(key, *args)
        try:
            return finish(proc, err, f"{SYSTEMS[key].name}: {' '.join(args)}", time.monotonic() + timeout)
        finally:
            stop(proc, err)

    def setup(self, system: System) -> dict[str, Any]:
        """Make the system runnable (its virtualenv, its tables): its versions, and under ``error``
        why it cannot run here."""
        try:
            self.python[system.key] = sys.executable if system.venv is None else str(ensure(system.venv, self.log))
        except Unavailable as exc:
            return {"error": str(exc)}
        return self.call(system.key, "setup")


def finish(proc: subprocess.Popen[str], err: IO[str], what: str, deadline: float) -> dict[str, Any]:
    """The ``@@result`` of a step once it exits; an error with its stderr if it fails or outlives ``deadline``."""
    try:
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError(f"{what}: still running at its deadline, killed\n{_tail(err)}") from None
    if proc.returncode:
        raise RuntimeError(f"{what}: exited with code {proc.returncode}\n{_tail(err)}")
    for line in reversed(out.splitlines()):
        if line.startswith(RESULT):
            return dict(json.loads(line[len(RESULT):]))
    raise RuntimeError(f"{what}: exited without a result\n{out[-2000:]}\n{_tail(err)}")


def stop(proc: subprocess.Popen[str], err: IO[str]) -> None:
    """End a step this phase started (if it still runs) and drop its stderr file."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    err.close()


def _tail(err: IO[str]) -> str:
    err.seek(0)
    return err.read()[-3000:]


def await_ready(proc: subprocess.Popen[str], err: IO[str], what: str, deadline: float) -> None:
    assert proc.stdout is not None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"{what}: not ready in {READY_TIMEOUT:.0f} s\n{_tail(err)}")
        readable, _, _ = select.select([proc.stdout], [], [], left)
        if not readable:
            continue
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            raise RuntimeError(f"{what}: exited with code {proc.returncode} before it was ready\n{_tail(err)}")
        if line.rstrip("\n") == READY:
            return


def drain(runner: Runner, key: str, index: int, w: int, count: int) -> tuple[list[int], float]:
    """Enqueue ``count`` no-op tasks, drain them with W workers of the system's ``index``-th
    configuration; the tasks executed (one entry per execution) and the rate (tasks/s)."""
    config = SYSTEMS[key].drains[index]
    return drain_with(runner, key, config.label, (config.command, *config.args), w, count)


def drain_with(runner: Runner, key: str, label: str, command: tuple[str, ...], w: int, count: int,
               task: tuple[str, ...] = ()) -> tuple[list[int], float]:
    """Enqueue ``count`` tasks (``task``: the kind and its JSON arguments, ``tasks_runner prepare``;
    no-op ones by default), drain them with W workers running ``manage.py COMMAND ARGS…``
    (``command``); the tasks executed (one entry per execution) and the rate (tasks/s)."""
    runner.call(key, "prepare", str(count), *task)
    workers = [runner.start(key, "worker", *command) for _ in range(w)]
    try:
        ready_by = time.monotonic() + READY_TIMEOUT
        for proc, err in workers:
            await_ready(proc, err, label, ready_by)
        for proc, _ in workers:  # the start signal, to every worker back to back
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        done_by = time.monotonic() + 120 + count / 20
        out = [finish(proc, err, f"{label} worker {i}", done_by) for i, (proc, err) in enumerate(workers)]
    finally:
        for proc, err in workers:
            stop(proc, err)
    state = runner.call(key, "count")
    if state["succeeded"] != count or state["unfinished"]:
        raise RuntimeError(f"{label} W={w}: {state['succeeded']} tasks succeeded and {state['unfinished']} "
                           f"unfinished, expected {count} and 0")
    span = max(r["end"] for r in out) - min(r["start"] for r in out)
    return [i for r in out for i in r["executed"]], count / span


def run(url: str, sizes: Sizes, results: TasksResults, *, peers: bool, log: Callable[[str], None]) -> None:
    """Measure every system this machine can run, ``sizes.rounds`` interleaved rounds."""
    runner = Runner(url, log)
    results.workers, results.drain_tasks, results.bulk_tasks = sizes.tasks_workers, sizes.tasks_drain, sizes.tasks_bulk
    measured: list[System] = []
    for key in (OURS, *PEERS):
        system = SYSTEMS[key]
        found = {"error": "--no-peers"} if key != OURS and not peers else runner.setup(system)
        why = found.pop("error", None)
        results.versions[key] = {k: str(v) for k, v in found.items()}
        if why:
            results.skipped[key] = why
            log(f"  {system.name} ({system.backend}): not measured: {why}")
            continue
        measured.append(system)
        for config in system.drains:
            results.system_of[config.label] = key
        for label, _ in system.bulks:
            results.system_of[label] = key
    w, n, bulk = sizes.tasks_workers, sizes.tasks_drain, sizes.tasks_bulk
    for round_ in range(sizes.rounds):
        # Interleaved: every system and configuration once per round, so that load from
        # elsewhere hits them alike, each round starting with the next system, so that none is
        # always first; each round's best configuration is a system's figure.
        order = measured[round_ % len(measured):] + measured[:round_ % len(measured)] if measured else []
        for system in order:
            for index, config in enumerate(system.drains):
                executed, value = drain(runner, system.key, index, w, n)
                distinct = set(executed)
                if len(distinct) != n:
                    raise RuntimeError(f"{config.label} W={w}: {len(distinct)} distinct tasks executed, expected {n}")
                results.duplicates[config.label] = results.duplicates.get(config.label, 0) + len(executed) - n
                results.drain_runs.setdefault(config.label, []).append(value)
                log(f"  tasks drain {config.label} W={w} round {round_ + 1}/{sizes.rounds}: {value:,.0f} tasks/s")
        for system in order:
            for label, how in system.bulks:
                seconds = float(runner.call(system.key, "bulk", str(bulk), how)["seconds"])
                results.bulk_runs.setdefault(label, []).append(seconds)
                log(f"  tasks bulk enqueue {label} round {round_ + 1}/{sizes.rounds}: {bulk:,} in "
                    f"{seconds:.2f} s ({bulk / seconds:,.0f} tasks/s)")
