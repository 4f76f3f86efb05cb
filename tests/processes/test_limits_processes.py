"""Concurrency limits between real worker processes: a limit of 2 under 3 workers × 4 threads is
never exceeded and is fully used, measured by the bodies' own start and end times; a SIGKILLed
holder's place frees when its lease runs out."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.processes import Supervisor
from django_taskclaim.models import Task
from tests.processes.test_django_tasks_processes import started, workers
from tests.testapp import limited_tasks
from tests.testapp.models import Span

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

HOLD = 0.3
TASKS = 12


def most_at_once(spans: list[Span]) -> int:
    """The most bodies running at one moment (an end before a start at the same microsecond)."""
    edges = sorted([(s.started_us, 1) for s in spans] + [(s.ended_us, -1) for s in spans])
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


@pytest.mark.parametrize("batch", [1, 3])
def test_racing_claims_never_overshoot(processes: Supervisor, batch: int) -> None:
    """Eight processes claim at once (one statement each, ``batch`` tasks at most) from a key
    limited to 2 and an unlimited key: exactly 2 of the limited key are claimed, whoever wins (without
    the gates, each statement's snapshot saw 0 running and all 8 claimed one)."""
    for n in range(20):
        Task.objects.ensure(f"limited-{n}", queue="default", concurrency_key="k", concurrency_limit=2)
    for n in range(4):
        Task.objects.ensure(f"free-{n}", queue="default")
    fleet = processes.start("tests.programs.fleet", "8", "tests.programs.claimer", "race-next", "--batch",
                            str(batch), group=True)
    for _ in range(8):
        fleet.event("ready", timeout=60)
    fleet.send("go")
    claimed = [key for _ in range(8) for key in fleet.event("done", timeout=60)["keys"]]
    fleet.end_input()
    fleet.finish(60)
    # Exactly the limit, on every database. (MariaDB once came away with one: each claim sorted the
    # queue's backlog and kept all of it locked, so the racers skipped every task; migration 0009.)
    assert sum(key.startswith("limited-") for key in claimed) == 2
    assert Task.objects.filter(concurrency_key="k", status="running").count() == 2
    # A claim whose limited candidate lost the key's last place to a racer claims nothing else in that
    # statement; the next claim takes the other key's tasks (never the full key's).
    left = {c.key for c in Task.objects.claim_next(limit=10)}
    assert left == {f"free-{n}" for n in range(4)} - set(claimed)


def test_a_limit_of_two_under_three_workers_of_four_threads(processes: Supervisor) -> None:
    for _ in range(TASKS):
        limited_tasks.call_api.enqueue("acme", hold=HOLD)
    limited_tasks.call_api.enqueue("other", hold=HOLD)  # another key, beside the full one
    procs = workers(processes, 3, "--concurrency", "4")
    for proc in procs:
        proc.finish(120)
    spans = list(Span.objects.all())
    assert len(spans) == TASKS + 1 and Task.objects.exclude(status="succeeded").count() == 0
    acme = [s for s in spans if Task.objects.get(key=s.task_key).concurrency_key == "api:acme"]
    assert most_at_once(acme) == 2  # never more, and at some moment both places used
    # Fully used: the bodies ran for TASKS * HOLD seconds, two at a time at best.
    elapsed = (max(s.ended_us for s in acme) - min(s.started_us for s in acme)) / 1e6
    busy = sum(s.ended_us - s.started_us for s in acme) / 1e6
    print(f"limit 2: {TASKS} tasks of {HOLD}s in {elapsed:.2f}s, use {busy / (2 * elapsed):.0%}")
    assert busy / (2 * elapsed) > 0.5


def test_a_killed_holders_place_frees_when_its_lease_runs_out(processes: Supervisor, tmp_path: Path) -> None:
    limited_tasks.solo.enqueue("first")
    limited_tasks.solo.enqueue("second")
    env = {"TASKCLAIM_TEST_STARTED_DIR": str(tmp_path), "TASKCLAIM_TEST_HOLD_FIRST": "30"}
    procs = workers(processes, 1, env=env)
    holder = started(tmp_path, "first", procs)
    holder.kill()
    holder.wait(timeout=60)
    [after] = workers(processes, 1, "--concurrency", "4")  # no hold: the takeover runs at once
    after.finish(120)
    spans = {s.task_key: s for s in Span.objects.all()}
    assert set(spans) == {"first", "second"}
    assert spans["first"].ended_us <= spans["second"].started_us  # one at a time, the dead holder's first
    # "first" was taken over (token 2) by the second worker, after the dead one's lease.
    assert Task.objects.filter(concurrency_key="solo", status="succeeded", fencing_token=2).count() == 1
