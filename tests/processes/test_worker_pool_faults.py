"""The proof of issue 32 (item 7): ``taskclaim_worker --concurrency 16`` processes drain a queue while
workers are SIGKILLed and SIGSTOPped past their lease; the checker counts the effects: every task's
exactly once (0 lost, 0 twice), written under the token that completed it, and nothing from the tasks
that ran past their ``--timeout``. Two forms of eight processes: a fleet of eight separate workers,
and one supervisor (``--processes 8``) whose children are the ones struck (a killed child is
restarted by the supervisor and may be struck in its turn).

CI's form drains 300 tasks; ``TASKCLAIM_TEST_POOL_TASKS=5000`` runs the long form. The tasks wait
(I/O-bound, ``time.sleep``), so eight processes of sixteen threads are mostly waiting on two cores.
"""

from __future__ import annotations

import os
import random
import signal
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from devtools.polling import wait_until
from devtools.processes import Child, send
from django_taskclaim.models import Task
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROCESSES, CONCURRENCY, LEASE, TIMEOUT = 8, 16, 2, 1
TASKS = int(os.environ.get("TASKCLAIM_TEST_POOL_TASKS", "300"))
LATE = 4  # tasks that run past --timeout: FAILED, no effect
HANDLER = "tests.programs.worker_handlers.paced_effect"
#: The handler's pace: each task waits 50 ms; a late one 3 timeouts more.
PACE = {"TASKCLAIM_TEST_WORK": "0.05", "TASKCLAIM_TEST_LATE": str(3 * TIMEOUT)}
#: The worker's options in both forms (``--until-drained`` only for the fleet: the supervisor is stopped by SIGTERM).
OPTIONS = ("--concurrency", str(CONCURRENCY), "--batch", "8", "--lease", str(LEASE), "--timeout", str(TIMEOUT))


def owner_of(pid: int) -> Any:
    return Task.objects.filter(owner__contains=f":{pid}:")


def enqueue() -> tuple[list[str], list[str]]:
    """The queue to drain: ``TASKS`` tasks that each leave one effect, and ``LATE`` that run past the timeout."""
    keys = [f"t{i:05d}" for i in range(TASKS)]
    Task.objects.bulk_create([Task(key=key, queue="default", max_attempts=100) for key in keys])
    late = [f"late{i}" for i in range(LATE)]
    Task.objects.bulk_create([Task(key=key, queue="default", max_attempts=1, priority=5) for key in late])
    return keys, late


def drained() -> None:
    wait_until(lambda: not Task.objects.exclude(status__in=("succeeded", "failed")).exists(), timeout=300,
               what="the queue to drain")


def check_effects(keys: list[str], late: list[str]) -> None:
    """The checker: 0 lost, 0 twice, each effect under the token that completed its task; nothing
    committed by a task past its timeout."""
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


def test_eight_concurrent_workers_drain_under_kills_and_pauses_with_every_effect_once(processes) -> None:  # type: ignore[no-untyped-def]
    keys, late = enqueue()
    fleet = processes.start("tests.programs.fleet", str(PROCESSES), "tests.programs.pool_worker", HANDLER,
                            *OPTIONS, "--until-drained", env=PACE)
    pids = [fleet.event("ready", timeout=120)["pid"] for _ in range(PROCESSES)]
    fleet.send("go")
    rng = random.Random(32)
    killed, paused = nemesis(rng, lambda: pids, TASKS)
    fleet.end_input()
    drained()
    code = fleet.wait(120)
    assert code == (1 if killed else 0)  # the fleet names each copy that did not exit 0: the killed ones
    reports = {e["pid"]: e for e in fleet.events if e.get("event") == "done"}
    assert set(reports) == set(pids) - set(killed)
    check_effects(keys, late)
    assert killed and paused, "the nemesis struck"


def test_a_supervisor_of_eight_concurrent_children_drains_under_kills_and_pauses_of_its_children(processes) -> None:  # type: ignore[no-untyped-def]
    """``taskclaim_worker --processes 8 --concurrency 16``: the nemesis strikes the supervisor's
    children (their pids from its ``--json`` events), the supervisor restarts each one killed, and
    every effect is there once. Then SIGTERM: each child, running again and holding nothing (the
    queue is drained), stops within the grace with 0, and so does the supervisor: 75 would mean a
    child outlived the grace, and none may, as none is stopped any more and none holds a task.
    (Before the children left by ``os._exit``, their interpreter's teardown, seconds on loaded
    cores, outlived the 2 s grace: the supervisor killed children that held nothing, exit 75.)"""
    keys, late = enqueue()
    boss = processes.start("django", "taskclaim_worker", HANDLER, "--json", "--processes", str(PROCESSES), *OPTIONS,
                           env=PACE)
    for _ in range(PROCESSES):
        boss.event("worker_started", timeout=120)
    killed, paused = nemesis(random.Random(32), lambda: children(boss), TASKS)
    drained()
    died = {e["pid"]: e["how"] for e in boss.events if e.get("event") == "worker_died"}
    assert died == dict.fromkeys(killed, "signal SIGKILL")  # a pause is no death: nothing else died
    wait_until(lambda: len(children(boss)) == PROCESSES, timeout=60, what="the killed children's restarts")
    check_effects(keys, late)
    live = children(boss)
    boss.signal(signal.SIGTERM)
    assert boss.wait(120) == 0, boss.stderr()
    stopped = {e["pid"]: e["exitcode"] for e in boss.events if e.get("event") == "worker_stopped"}
    # 0, or SIGTERM's own default for a child restarted so lately that it is still starting (its
    # interpreter not yet set up: it claimed nothing); the supervisor counts both as clean.
    assert set(stopped) == set(live) and set(stopped.values()) <= {0, -signal.SIGTERM}, stopped
    assert killed and paused, "the nemesis struck"


def children(boss: Child) -> list[int]:
    """The pids of the supervisor's children running now, from its ``--json`` events (its own
    children also include multiprocessing's resource tracker, which is no worker)."""
    alive: dict[int, bool] = {}
    for event in boss.events:
        if event.get("event") == "worker_started":
            alive[event["pid"]] = True
        elif event.get("event") in ("worker_died", "worker_finished", "worker_stopped", "worker_refused"):
            alive[event["pid"]] = False
    return [pid for pid, running in alive.items() if running]


def nemesis(rng: random.Random, workers: Callable[[], list[int]], total: int) -> tuple[list[int], list[int]]:
    """Two SIGKILLs and two SIGSTOPs past the lease, each once a tenth more of the queue is done,
    each of one of ``workers()`` (the pids of the worker processes now), a busy one if any is."""
    killed: list[int] = []
    paused: list[int] = []
    faults = ["kill", "pause", "kill", "pause"]
    for step, fault in enumerate(faults, start=1):
        goal = total * step // (len(faults) + 2)
        wait_until(lambda goal=goal: Task.objects.filter(status="succeeded").count() >= goal, timeout=240,
                   what=f"{goal} tasks done before the next fault")
        live = [pid for pid in workers() if pid not in killed]
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
