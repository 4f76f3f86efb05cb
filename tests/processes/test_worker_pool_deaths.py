"""Nothing but the dead tasks pay for a death (issue 32, item 5): a ``--concurrency 4 --batch 8``
worker SIGKILLed with four tasks in flight charges those four one attempt each; every other task is
untouched (never started, its attempt count unchanged) and claimable at once, not after a lease."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from devtools.polling import wait_until
from django_taskclaim.lifecycle.claim import RESERVATION
from django_taskclaim.models import Attempt, Task
from tests.conftest import expire
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HANDLER = "tests.programs.worker_handlers.fenced_effect"


def test_a_concurrent_worker_killed_charges_only_the_tasks_it_had_started(processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    slow = [f"slow{i}" for i in range(4)]
    plain = [f"plain{i:02d}" for i in range(12)]
    for key in slow:  # claimed first; each holds still on its first attempt, where the kill lands
        Task.objects.ensure(key, queue="default", priority=10)
    for key in plain:
        Task.objects.ensure(key, queue="default")
    env = {"TASKCLAIM_TEST_STARTED_DIR": str(tmp_path), "TASKCLAIM_TEST_HOLD": "60"}
    worker = processes.start("django", "taskclaim_worker", HANDLER, "--concurrency", "4", "--batch", "8",
                             "--lease", "30", env=env)
    wait_until(lambda: len(list(tmp_path.glob("slow*.1.*"))) == 4, timeout=60, what="four slow tasks to start")
    worker.kill()
    worker.wait(timeout=30)
    killed_at = time.monotonic()

    # Every task but the four in flight is claimable now: pending, or reserved for at most RESERVATION.
    def claimable() -> list[str]:
        tasks = Task.objects.filter(key__in=plain)
        pending_or_expired = tasks.pending() | tasks.expired()
        return sorted(pending_or_expired.values_list("key", flat=True))

    wait_until(lambda: claimable() == plain, timeout=RESERVATION + 5, what="the bystanders to be claimable")
    assert time.monotonic() - killed_at < RESERVATION + 5  # soon: not after the 30 s lease
    assert set(Task.objects.filter(key__in=plain).values_list("attempts", flat=True)) == {0}
    assert not Attempt.objects.filter(task__key__in=plain).exists()
    dead = Task.objects.filter(key__in=slow)
    assert set(dead.values_list("status", "attempts")) == {(Task.Status.RUNNING, 1)}

    for task in dead:  # as if their 30 s leases had run out
        expire(task)
    again = processes.start("django", "taskclaim_worker", HANDLER, "--concurrency", "4", "--batch", "8",
                            "--lease", "30", "--until-drained", "--json", env=env)
    report = again.finish(120)
    assert report["succeeded"] == 16
    assert Counter(Effect.objects.values_list("task_key", flat=True)) == dict.fromkeys(slow + plain, 1)
    attempts = dict(Task.objects.values_list("key", "attempts"))
    assert attempts == {**dict.fromkeys(slow, 2), **dict.fromkeys(plain, 1)}
    assert Counter(Attempt.objects.values_list("outcome", flat=True))["succeeded"] == 16


def test_a_concurrent_worker_killed_while_holding_spares_charges_none_of_them(processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 40, item 21: the spares a ``--concurrency 2`` worker holds ready are reserved, never
    started: killed with two tasks in flight and a spare in hand, it charges the two, and the spare
    comes back within its reservation, its attempt count unchanged, no attempt row of its own."""
    Task.objects.ensure("slow0", queue="default", priority=30)
    Task.objects.ensure("quick", queue="default", priority=20)  # its completion makes its slot want a spare
    for key in ("slow1", "slow2"):  # the slot it frees takes slow1; slow2 is held as its spare
        Task.objects.ensure(key, queue="default")
    env = {"TASKCLAIM_TEST_STARTED_DIR": str(tmp_path), "TASKCLAIM_TEST_HOLD": "60"}
    # A handler that returns (its result stored by the worker, whose completion takes a spare).
    worker = processes.start("django", "taskclaim_worker", "tests.programs.worker_handlers.effect",
                             "--concurrency", "2", "--lease", "30", env=env)
    spare = Task.objects.filter(key="slow2", status=Task.Status.RUNNING)
    wait_until(lambda: len(list(tmp_path.glob("slow*.1.*"))) == 2 and spare.exists(), timeout=60,
               what="two slow tasks in flight and slow2 held as a spare")
    assert not list(tmp_path.glob("slow2.*"))  # held, not run
    worker.kill()
    worker.wait(timeout=30)
    assert Task.objects.get(key="slow2").attempts == 0  # reserved: its attempt never counted
    assert not Attempt.objects.filter(task__key="slow2").exists()
    tasks = Task.objects.filter(key="slow2")
    wait_until(lambda: (tasks.pending() | tasks.expired()).exists(), timeout=RESERVATION + 5,
               what="the spare to be claimable again")
    assert set(Task.objects.filter(key__in=["slow0", "slow1"]).values_list("status", "attempts")) == {
        (Task.Status.RUNNING, 1)}  # the two in flight: charged one attempt each
