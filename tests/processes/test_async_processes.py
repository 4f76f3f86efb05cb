"""The async API between real OS processes: coroutine callers in several processes run the work
once, and ``akeepalive()`` holds a long coroutine's claim against another process and is fenced
off when its process wakes from SIGSTOP past the lease (``tests/programs/async_claimer.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from devtools.processes import Child, Supervisor
from django_taskclaim.models import Attempt, Task
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def spawn_async(processes: Supervisor) -> Callable[..., Child]:
    """Start ``python -m tests.programs.async_claimer ARGS`` children of ``processes``."""
    return partial(processes.start, "tests.programs.async_claimer")


@pytest.mark.slow
def test_arun_once_across_processes_each_gathering_callers_runs_once(processes, spawn_async) -> None:  # type: ignore[no-untyped-def]
    procs = [spawn_async("gather", "job", "--callers", "6", "--work", "0.5") for _ in range(3)]
    processes.go(*procs)
    results = [r for proc in procs for r in proc.finish(60)["results"]]
    effect = Effect.objects.get()  # one execution among 18 callers in 3 processes
    assert results == [{"by": effect.worker}] * 18


@pytest.mark.slow
def test_akeepalive_holds_a_long_coroutine_claim_against_another_process(spawn_async) -> None:  # type: ignore[no-untyped-def]
    holder = spawn_async("hold", "job", "--lease", "1")
    assert holder.event(timeout=60) == {"event": "claimed", "token": 1}
    contender = spawn_async("contend", "job", "--lease", "30")
    contender.event("ready", timeout=60)
    # The holder's coroutine runs on while its 1 s lease is renewed four more times, and the
    # contender tries to claim every 50 ms all along.
    seen: set[Any] = set()

    def renewed() -> bool:
        seen.add(Task.objects.get().lease_expires_at)
        return len(seen) >= 5

    deadline = time.monotonic() + 60
    while not renewed():
        assert time.monotonic() < deadline, "the lease was not renewed"
        time.sleep(0.05)
    holder.send("finish")
    contender.send("stop")
    assert holder.event(timeout=60) == {"event": "done", "token": 1}
    report = contender.event(timeout=60)
    assert report["wins"] == 0 and report["tries"] > 10, report
    task = Task.objects.get()
    assert (task.status, task.fencing_token, task.result) == ("succeeded", 1, "held")
    assert list(Effect.objects.values_list("token", flat=True)) == [1]


@pytest.mark.slow
def test_a_paused_async_worker_is_fenced_off_when_it_wakes(spawn_async) -> None:  # type: ignore[no-untyped-def]
    """SIGSTOP past the lease: another process takes over; on SIGCONT the holder's akeepalive
    is refused, and its fenced publish never runs."""
    holder = spawn_async("hold", "job", "--lease", "1")
    assert holder.event(timeout=60) == {"event": "claimed", "token": 1}
    holder.stop()
    contender = spawn_async("contend", "job", "--lease", "30")
    contender.event("ready", timeout=60)
    deadline = time.monotonic() + 60
    while not Task.objects.filter(fencing_token=2).exists():  # the lease ran out: taken over
        assert time.monotonic() < deadline, "nobody took the paused worker's task over"
        time.sleep(0.05)
    holder.cont()
    while not Attempt.objects.filter(token=1, stale_writes__gt=0).exists():  # its heartbeat refused
        assert time.monotonic() < deadline, "the woken worker's heartbeat was not refused"
        time.sleep(0.05)
    holder.send("finish")
    contender.send("stop")
    assert holder.event(timeout=60) == {"event": "stale", "action": "keepalive"}
    assert contender.event(timeout=60)["wins"] == 1
    assert Effect.objects.count() == 0  # the stale worker published nothing
    assert Attempt.objects.get(token=1).outcome == "taken_over"
