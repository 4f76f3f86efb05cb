"""The proof of issue 32 (item 7): eight ``taskclaim_worker --concurrency 16`` processes drain a queue
while workers are SIGKILLed and SIGSTOPped past their lease; the checker counts the effects: every
task's exactly once (0 lost, 0 twice), written under the token that completed it, and nothing from
the tasks that ran past their ``--timeout``.

CI's form drains 300 tasks; ``TASKCLAIM_TEST_POOL_TASKS=5000`` runs the long form. The tasks wait
(I/O-bound, ``time.sleep``), so eight processes of sixteen threads are mostly waiting on two cores.
"""

from __future__ import annotations

import os
import random
import signal
from collections import Counter
from typing import Any

import pytest

from devtools.polling import wait_until
from devtools.processes import send
from django_taskclaim.models import Task
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROCESSES, CONCURRENCY, LEASE, TIMEOUT = 8, 16, 2, 1
TASKS = int(os.environ.get("TASKCLAIM_TEST_POOL_TASKS", "300"))
LATE = 4  # tasks that run past --timeout: FAILED, no effect


def owner_of(pid: int) -> Any:
    return Task.objects.filter(owner__contains=f":{pid}:")


def test_eight_concurrent_workers_drain_under_kills_and_pauses_with_every_effect_once(processes) -> None:  # type: ignore[no-untyped-def]
    keys = [f"t{i:05d}" for i in range(TASKS)]
    Task.objects.bulk_create([Task(key=key, queue="default", max_attempts=100) for key in keys])
    late = [f"late{i}" for i in range(LATE)]
    Task.objects.bulk_create([Task(key=key, queue="default", max_attempts=1, priority=5) for key in late])
    env = {"TASKCLAIM_TEST_WORK": "0.05", "TASKCLAIM_TEST_LATE": str(3 * TIMEOUT)}
    fleet = processes.start("tests.programs.fleet", str(PROCESSES), "tests.programs.pool_worker",
                            "tests.programs.worker_handlers.paced_effect", "--concurrency", str(CONCURRENCY),
                            "--batch", "8", "--lease", str(LEASE), "--timeout", str(TIMEOUT), "--until-drained",
                            env=env)
    pids = [fleet.event("ready", timeout=120)["pid"] for _ in range(PROCESSES)]
    fleet.send("go")
    rng = random.Random(32)
    killed, paused = nemesis(rng, pids, TASKS)
    fleet.end_input()
    wait_until(lambda: not Task.objects.exclude(status__in=("succeeded", "failed")).exists(), timeout=300,
               what="the queue to drain")
    code = fleet.wait(120)
    assert code == (1 if killed else 0)  # the fleet names each copy that did not exit 0: the killed ones
    reports = {e["pid"]: e for e in fleet.events if e.get("event") == "done"}
    assert set(reports) == set(pids) - set(killed)

    # The checker: 0 lost, 0 twice, each effect under the token that completed its task.
    effects = Counter(Effect.objects.filter(task_key__in=keys).values_list("task_key", flat=True))
    lost = sorted(set(keys) - set(effects))
    twice = sorted(k for k, n in effects.items() if n > 1)
    assert (lost, twice) == ([], []), f"{len(lost)} lost, {len(twice)} applied twice"
    tokens = dict(Task.objects.filter(key__in=keys).values_list("key", "fencing_token"))
    assert all(tokens[e.task_key] == e.token for e in Effect.objects.filter(task_key__in=keys))
    assert set(Task.objects.filter(key__in=keys).values_list("status", flat=True)) == {"succeeded"}
    # A sync task past its timeout cannot commit after it.
    assert not Effect.objects.filter(task_key__in=late).exists()
    assert set(Task.objects.filter(key__in=late).values_list("status", flat=True)) == {"failed"}
    assert killed and paused, "the nemesis struck"


def nemesis(rng: random.Random, pids: list[int], total: int) -> tuple[list[int], list[int]]:
    """Two SIGKILLs and two SIGSTOPs past the lease, each once a tenth more of the queue is done."""
    killed: list[int] = []
    paused: list[int] = []
    faults = ["kill", "pause", "kill", "pause"]
    for step, fault in enumerate(faults, start=1):
        goal = total * step // (len(faults) + 2)
        wait_until(lambda goal=goal: Task.objects.filter(status="succeeded").count() >= goal, timeout=240,
                   what=f"{goal} tasks done before the next fault")
        live = [pid for pid in pids if pid not in killed]
        busy = [pid for pid in live if owner_of(pid).filter(status="running").exists()] or live
        victim = rng.choice(busy)
        if fault == "kill":
            send(victim, signal.SIGKILL)
            killed.append(victim)
            continue
        send(victim, signal.SIGSTOP)
        paused.append(victim)
        try:  # past its lease: a task of its own expired (and may be taken over)
            wait_until(lambda victim=victim: owner_of(victim).expired().exists()
                       or not owner_of(victim).filter(status="running").exists(), timeout=60,
                       what="the paused worker's lease to run out")
        finally:
            send(victim, signal.SIGCONT)
    return killed, paused
