"""A result that cannot be stored, raced for by OS processes: the effect lands once, the task ends
FAILED, and callers that come after the lease ran out are refused rather than running it again."""

from __future__ import annotations

import time

import pytest

from django_taskclaim.models import Task

pytestmark = pytest.mark.django_db(transaction=True)


def _wave(processes, procs) -> list[str]:  # type: ignore[no-untyped-def]
    """The ``procs`` (each ready) call run_once at the same moment; their outcomes."""
    processes.go(*procs)
    return [proc.event("done", timeout=60)["outcome"] for proc in procs]


@pytest.mark.parametrize("kind", ["set", "nul", "surrogate"])
def test_racing_processes_run_an_unstorable_effect_once(processes, kind: str) -> None:  # type: ignore[no-untyped-def]
    """Processes race on one key whose result cannot be stored; more come after the lease ran out.
    The effect lands once: the winner ends the task FAILED, every other caller is refused.
    (The second wave's callers are the same four processes, each calling again: the database
    decides, and a process holds nothing between its calls.)"""
    from tests.testapp.models import Effect

    procs = [processes.start("tests.programs.run_once_caller", "race", kind, "0.5") for _ in range(4)]
    first = _wave(processes, procs)
    assert first.count("InvalidResult") == 1, first
    assert set(first) <= {"InvalidResult", "TaskBusy", "TaskFailed"}, first
    # The next wave comes once no live lease holds the task (at once when it ended FAILED).
    deadline = time.monotonic() + 30
    while Task.objects.live().filter(key="race").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = _wave(processes, procs)
    assert second == ["TaskFailed"] * 4, second
    for proc in procs:
        proc.end_input()
        proc.finish(60)
    assert Effect.objects.filter(task_key="race").count() == 1
    assert Task.objects.get(key="race").status == "failed"
