"""Races between real OS processes: one winner, exactly-once effects, fencing under pauses and kills."""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter

import pytest
from django.db.models import Sum

from devtools.processes import Child, Supervisor
from django_taskclaim.models import Attempt, Task
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def make_tasks(n: int, start: int = 0, **fields) -> None:  # type: ignore[no-untyped-def]
    Task.objects.bulk_create([Task(key=f"task-{i:05d}", queue="default", **fields) for i in range(start, start + n)])


def assert_exactly_once(n: int) -> None:
    """Every task SUCCEEDED, one effect each, written under the token that completed it."""
    statuses = Counter(Task.objects.values_list("status", flat=True))
    assert statuses == {"succeeded": n}, statuses
    per_task = Counter(Effect.objects.values_list("task_key", flat=True))
    doubled = {k: c for k, c in per_task.items() if c > 1}
    assert not doubled, f"effects applied twice: {doubled}"
    assert len(per_task) == n, f"{n - len(per_task)} task(s) without an effect"
    tokens = dict(Task.objects.values_list("key", "fencing_token"))
    assert all(tokens[e.task_key] == e.token for e in Effect.objects.all())


def test_sixteen_processes_race_for_one_key_and_one_wins(processes) -> None:  # type: ignore[no-untyped-def]
    # Sixteen OS processes forked from one that set Django up (tests/programs/fleet.py): each
    # racer has its own pid and connection, and Django's start-up is paid once, not sixteen times.
    fleet = processes.start("tests.programs.fleet", "16", "tests.programs.claimer", "race",
                            "payments:test-generation", group=True)
    ready = [fleet.event("ready", timeout=60) for _ in range(16)]
    assert len({r["pid"] for r in ready}) == 16  # sixteen processes, each connected before any starts
    fleet.send("go")
    results = [fleet.event("done", timeout=60) for _ in range(16)]
    fleet.end_input()
    fleet.finish(60)
    winners = [r for r in results if r["claimed"]]
    assert len(winners) == 1, results
    assert winners[0]["token"] == 1
    losers = [r for r in results if not r["claimed"]]
    assert all(r["status"] == "running" and r["owner"] == winners[0]["owner"] for r in losers)
    task = Task.objects.get()
    assert (task.fencing_token, task.attempts) == (1, 1)
    assert Counter(Attempt.objects.values_list("outcome", flat=True)) == {"running": 1, "duplicate": 15}


def assert_handed_out_once(fleet: Supervisor, n: int) -> None:
    """Under a lease far longer than the run, every task was handed out exactly once.

    Checked from what the workers were given (each ``(task, token)`` once, every token 1, so no
    task ever had two owners) and from the database (no attempt taken over, no write fenced
    off): a queue that handed one task to two callers shows up here even when fencing kept the
    effects exactly once.
    """
    handed = Counter((e["key"], e["token"]) for _, e in fleet.log if e["event"] == "claimed")
    twice = {k: c for k, c in handed.items() if c > 1}
    assert not twice, f"(task, token) handed out more than once: {twice}"
    per_task = Counter(key for key, _ in handed)
    again = {k: c for k, c in per_task.items() if c > 1}
    assert not again, f"tasks handed to more than one owner: {again}"
    assert len(per_task) == n and {token for _, token in handed} == {1}
    assert [e for _, e in fleet.log if e["event"] == "stale"] == []
    assert not Attempt.objects.filter(outcome="taken_over").exists()
    assert (Attempt.objects.aggregate(n=Sum("stale_writes"))["n"] or 0) == 0
    assert Attempt.objects.filter(token__isnull=False).count() == n


def drain_fleet(processes: Supervisor, copies: int, *args: str) -> Child:
    """``copies`` drainers (``claimer drain ARGS``), each its own process and connection, forked
    from one that set Django up (tests/programs/fleet.py). A drainer's owner is its tag and pid."""
    return processes.start("tests.programs.fleet", str(copies), "tests.programs.claimer", "drain", *args,
                           group=True)


def test_four_processes_drain_a_thousand_tasks_exactly_once(processes) -> None:  # type: ignore[no-untyped-def]
    make_tasks(1000)
    fleet = processes
    drainers = drain_fleet(processes, 4, "--lease", "30", "--batch", "5", "--tag", "w")
    drainers.end_input()
    drainers.finish(240)  # exit code 0: every copy's
    assert len({e["pid"] for _, e in fleet.log if e["event"] == "ready"}) == 4
    assert_exactly_once(1000)
    assert_handed_out_once(fleet, 1000)
    done = [e["done"] for _, e in fleet.log if e["event"] == "exit"]
    assert sum(done) == 1000 and len(done) == 4
    assert Attempt.objects.filter(outcome="succeeded").count() == 1000


def test_racing_claim_next_callers_never_share_a_task(processes) -> None:  # type: ignore[no-untyped-def]
    """Six processes released together call ``claim_next`` one task at a time on one queue."""
    n = 400
    make_tasks(n)
    fleet = processes
    drainers = drain_fleet(processes, 6, "--lease", "60", "--batch", "1", "--tag", "r", "--go")
    ready = [drainers.event("ready", timeout=60) for _ in range(6)]
    assert len({r["pid"] for r in ready}) == 6
    drainers.send("go")  # released together: the first claims race
    drainers.end_input()
    drainers.finish(240)  # exit code 0: every copy's
    assert_handed_out_once(fleet, n)
    assert_exactly_once(n)


def test_chaos_pauses_past_the_lease_and_kills_never_double_or_lose_work(processes, spawn) -> None:  # type: ignore[no-untyped-def]
    """Workers with a 0.5 s lease are SIGSTOPped past it and SIGKILLed (and replaced) while draining.

    The lease is five times a task's 0.1 s of work. 120 tasks to begin with, and 40 more whenever
    fewer than 40 are left before three pauses and a kill have happened (asserted below): workers
    that start fast (forked, tests/README.md) on an idle machine drain 120 tasks within the first
    pause, which waits for the paused task to be taken over.
    """
    n, lease = 120, "0.5"
    make_tasks(n, max_attempts=1000)
    rng = random.Random(int(os.environ.get("TASKCLAIM_CHAOS_SEED", "7")))
    fleet = processes

    def start() -> None:
        spawn("drain", "--lease", lease, "--work-ms", "100")

    def top_up() -> None:
        nonlocal n
        if (paused < 3 or kills < 1) and Task.objects.unfinished().count() < 40:
            make_tasks(40, start=n, max_attempts=1000)
            n += 40

    for _ in range(4):
        start()
    paused = kills = 0
    deadline = time.monotonic() + 150
    while Task.objects.unfinished().exists():
        assert time.monotonic() < deadline, "tasks left unfinished"
        top_up()
        # Catch a worker right after it claimed, i.e. inside its work, and act on it.
        got = fleet.next(0.5)
        if not got or got[1]["event"] != "claimed" or not got[0].alive():
            continue
        proc, event = got
        if paused < 3 or (kills >= 2 and rng.random() < 0.5):
            proc.stop()
            try:
                # Hold it until another worker has taken its task over (token moved on), so that
                # its fenced write on waking is certainly stale.
                until = time.monotonic() + 10
                while Task.objects.filter(key=event["key"], fencing_token=event["token"]).exists():
                    if time.monotonic() > until or not Task.objects.unfinished().exists():
                        break
                    top_up()
                    time.sleep(0.05)
            finally:
                proc.cont()  # never left stopped by an error above
            paused += 1
            while fleet.next(0):  # events queued meanwhile are old: act on fresh ones only
                pass
        else:
            proc.kill()
            kills += 1
            start()
    fleet.join(timeout=60)
    assert all(p.returncode in (0, -signal.SIGKILL) for p in fleet.children), fleet.failures()
    assert_exactly_once(n)
    refused = Attempt.objects.aggregate(n=Sum("stale_writes"))["n"] or 0
    reported = sum(1 for _, e in fleet.log if e["event"] == "stale")
    assert paused >= 3 and kills >= 1 and refused > 0, (paused, kills, refused)
    assert reported <= refused  # killed workers cannot report, the database still counted
    assert Attempt.objects.filter(outcome="taken_over").exists()
