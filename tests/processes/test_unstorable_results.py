"""A result that cannot be stored, raced for by OS processes: the effect lands once, the task ends
FAILED, and callers that come after the lease ran out are refused rather than running it again."""

from __future__ import annotations

import time

import pytest

from django_taskclaim.models import Task

pytestmark = pytest.mark.django_db(transaction=True)


def _wave(processes, key: str, kind: str, n: int) -> list[str]:  # type: ignore[no-untyped-def]
    """``n`` processes call run_once on ``key`` at the same moment; their outcomes."""
    procs = [processes.start("tests.programs.run_once_caller", key, kind, "0.5") for _ in range(n)]
    processes.go(*procs)
    return [proc.finish(60)["outcome"] for proc in procs]


@pytest.mark.parametrize("kind", ["set", "nul", "surrogate"])
def test_racing_processes_run_an_unstorable_effect_once(processes, kind: str) -> None:  # type: ignore[no-untyped-def]
    """Processes race on one key whose result cannot be stored; more come after the lease ran out.
    The effect lands once: the winner ends the task FAILED, every other caller is refused."""
    from tests.testapp.models import Effect

    first = _wave(processes, "race", kind, 4)
    assert first.count("InvalidResult") == 1, first
    assert set(first) <= {"InvalidResult", "TaskBusy", "TaskFailed"}, first
    # The next wave comes once no live lease holds the task (at once when it ended FAILED).
    deadline = time.monotonic() + 30
    while Task.objects.live().filter(key="race").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = _wave(processes, "race", kind, 4)
    assert second == ["TaskFailed"] * 4, second
    assert Effect.objects.filter(task_key="race").count() == 1
    assert Task.objects.get(key="race").status == "failed"
