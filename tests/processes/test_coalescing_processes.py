"""``@coalesced`` under 8 racing processes (forked by tests.programs.fleet, each with its own
database session): a storm of enqueues while the group's task waits is that one task, with the
arguments of the last enqueue to commit; a storm while it runs queues exactly one follow-up.
In one process: tests/integrations/django_tasks/test_django_tasks_coalescing.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connections

from devtools.processes import Supervisor
from django_taskclaim.models import CoalesceGroup, Task
from django_taskclaim.tasks.results import result_id
from tests.testapp import coalesced_tasks

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
RACERS, EACH = 8, 5
PATH = "tests.testapp.coalesced_tasks.reindex"


def storm(processes: Supervisor, doc: int, each: int = EACH) -> list[dict[str, Any]]:
    """8 racers released at once, each enqueueing ``reindex(doc)`` ``each`` times: their "done" events."""
    fleet = processes.start("tests.programs.fleet", str(RACERS), "tests.programs.coalescer", "storm", str(doc),
                            str(each), group=True)
    pids = {fleet.event("ready", timeout=60)["pid"] for _ in range(RACERS)}
    fleet.send("go")
    done = [fleet.event("done", timeout=60) for _ in range(RACERS)]
    fleet.end_input()
    fleet.finish(60)
    assert {d["pid"] for d in done} == pids
    return done


def newest_of_a_racer(row: Task, done: list[dict[str, Any]], each: int = EACH) -> None:
    """The row holds the arguments of some racer's last enqueue: the last of all to commit (a racer's
    enqueues commit in its order, so the last commit of the storm is a racer's last). The oldest
    arguments winning, or a lost update, would leave an earlier ``i``."""
    pid, i = row.payload["kwargs"]["version"]
    assert pid in {d["pid"] for d in done} and i == each - 1, row.payload


def test_a_storm_while_the_task_waits_is_one_task_with_the_last_committed_arguments(processes: Supervisor) -> None:
    done = storm(processes, 1)
    [row] = Task.objects.for_tenant("").filter(task_path=PATH)
    assert {i for d in done for i in d["ids"]} == {result_id(row)}  # 40 enqueues, every caller the same id
    assert row.status == Task.Status.PENDING and row.fencing_token == 0
    newest_of_a_racer(row, done)
    assert CoalesceGroup.objects.using(row._state.db).get(name="reindex:1").task_id == row.pk


def test_a_storm_while_the_task_runs_queues_exactly_one_follow_up(processes: Supervisor) -> None:
    running = coalesced_tasks.reindex.enqueue(2, version="first")
    [claim] = Task.objects.for_tenant("").claim_next(owner="worker", queue="default", path="*")
    done = storm(processes, 2)
    first, follow_up = Task.objects.for_tenant("").filter(task_path=PATH).order_by("id")  # two, never three
    assert result_id(first) == running.id and first.status == Task.Status.RUNNING
    assert follow_up.status == Task.Status.PENDING and follow_up.fencing_token == 0
    assert {i for d in done for i in d["ids"]} == {result_id(follow_up)}
    newest_of_a_racer(follow_up, done)
    claim.complete("done")


def test_a_storm_raced_by_a_worker_never_changes_a_started_task_and_the_last_run_has_the_newest_arguments(
        processes: Supervisor) -> None:
    """A worker claims and completes the group's tasks while the racers enqueue (a session of its own,
    on a thread of this process). A collapse that wrote into a task already claimed would make the
    arguments a run got differ from its row's; a follow-up made while the task still waited, or two,
    would leave a task never claimed before the last."""
    each, ran, stop = 10, {}, threading.Event()

    def worker() -> None:
        try:
            while True:
                claims = Task.objects.for_tenant("").claim_next(owner="racing-worker", queue="default", path="*")
                if not claims and stop.is_set():
                    return  # the storm is over and nothing is left
                for claim in claims:
                    ran[claim.task_id] = claim.payload
                    claim.complete("ok")
        finally:
            connections.close_all()

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        done = storm(processes, 3, each)
    finally:
        stop.set()
        thread.join(60)
    tasks = list(Task.objects.for_tenant("").filter(task_path=PATH).order_by("id"))
    assert [t.status for t in tasks] == [Task.Status.SUCCEEDED] * len(tasks) and set(ran) == {t.pk for t in tasks}
    assert all(ran[t.pk] == t.payload for t in tasks)  # each run got its row's arguments, never changed after
    newest_of_a_racer(tasks[-1], done, each)  # the last run had the last committed arguments
    by_id = {result_id(t): t.pk for t in tasks}
    for racer in done:  # a racer's enqueues commit in order: never back to an older task
        pks = [by_id[i] for i in racer["ids"]]
        assert pks == sorted(pks)
