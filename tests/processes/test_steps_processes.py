"""Durable steps across real OS processes SIGKILLed between steps (issue 43's proof).

A task of five steps (``tests.programs.stepper``), each step's function recording its call in its own
committed row; the process running it dies by SIGKILL, and the next one takes the task over once the
dead owner's one-second lease has run out (``run_once(on_busy="wait")``).
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from django_taskclaim.models import Step, Task

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = [f"step-{n}" for n in range(1, 6)]


def calls_of(key: str) -> Counter[str]:
    from tests.testapp.models import Effect

    return Counter(e.task_key.removeprefix(f"{key}:") for e in Effect.objects.filter(task_key__startswith=f"{key}:"))


def test_a_task_killed_after_each_step_in_turn_calls_every_step_once(processes) -> None:  # type: ignore[no-untyped-def]
    """Six processes one after another: each SIGKILLs itself right after the first step it ran was
    stored, so each runs one step more; the sixth finds all five stored and completes."""
    Task.objects.ensure("killed", max_attempts=10)  # six attempts: five die
    tokens = []
    for _ in range(5):
        child = processes.start("tests.programs.stepper", "killed", "after-new-step", "1")
        tokens.append(child.event("claimed", timeout=60)["token"])
        assert child.wait(60) == -signal.SIGKILL
    last = processes.start("tests.programs.stepper", "killed", "never", "1")
    tokens.append(last.event("claimed", timeout=60)["token"])
    assert last.finish(60)["result"] == [f"result-{n}" for n in range(1, 6)]
    assert tokens == [1, 2, 3, 4, 5, 6]  # each a takeover of the dead owner's task
    assert calls_of("killed") == Counter(STEPS)  # every step called exactly once in all
    task = Task.objects.get(key="killed")
    assert task.status == "succeeded" and task.result == [f"result-{n}" for n in range(1, 6)]
    # Step n was stored by the n-th process, the one that called it.
    assert sorted(Step.objects.filter(task=task).values_list("name", "token")) == [
        (name, n) for n, name in enumerate(STEPS, start=1)]


def test_a_process_killed_between_a_calls_return_and_its_store_repeats_that_step_only(processes) -> None:  # type: ignore[no-untyped-def]
    """The documented window: killed after step 3's function ran and before its result was stored,
    step 3 runs again in the next attempt; steps 1 and 2 (stored) and 4 and 5 do not repeat."""
    child = processes.start("tests.programs.stepper", "window", "before-store-3", "1")
    assert child.wait(60) == -signal.SIGKILL
    assert set(Step.objects.filter(task__key="window").values_list("name", flat=True)) == {"step-1", "step-2"}
    last = processes.start("tests.programs.stepper", "window", "never", "1")
    assert last.finish(60)["result"] == [f"result-{n}" for n in range(1, 6)]
    assert calls_of("window") == Counter({**Counter(STEPS), "step-3": 2})


def test_a_stale_owners_step_stores_nothing_and_it_answers_with_the_new_owners_result(processes) -> None:  # type: ignore[no-untyped-def]
    """The owner is paused (SIGSTOP) inside step 2's function; its lease runs out, another process
    takes the task over and runs steps 2–5. Continued, the first owner's store of step 2 is refused
    (StaleClaim): it stores nothing, and its run_once answers with the new owner's result."""
    stale = processes.start("tests.programs.stepper", "paused", "pause-before-store-2", "1")
    try:
        stale.event("paused", timeout=60)
        fresh = processes.start("tests.programs.stepper", "paused", "never", "1")
        assert fresh.event("claimed", timeout=60)["token"] == 2
        assert fresh.finish(60)["result"] == [f"result-{n}" for n in range(1, 6)]
    finally:
        stale.cont()
    assert stale.finish(60)["result"] == [f"result-{n}" for n in range(1, 6)]
    assert sorted(Step.objects.filter(task__key="paused").values_list("name", "token")) == [
        ("step-1", 1), *((name, 2) for name in STEPS[1:])]
    assert calls_of("paused") == Counter({**Counter(STEPS), "step-2": 2})
    from django_taskclaim.models import Attempt

    assert Attempt.objects.get(task__key="paused", token=1).stale_writes >= 1  # the refused store, counted
