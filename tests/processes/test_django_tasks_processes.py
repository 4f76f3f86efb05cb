"""ClaimBackend with real processes: 8 processes enqueueing one identity at once, workers
SIGKILLed and SIGSTOPped mid-task, a task whose last attempt dies, and rows of other kinds
(run_once, the Celery bridge, LangGraph nodes) that no queue worker may take."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from devtools.polling import wait_until
from django_taskclaim.models import Attempt, Task
from django_taskclaim.tasks.compat import TaskResultStatus
from tests.conftest import expire, spawning
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def workers(start, n: int, *extra: str):  # type: ignore[no-untyped-def]
    """``taskclaim_worker`` processes running the Django tasks of the default queue."""
    return [start("taskclaim_worker", "--lease", "2", "--until-drained", "--json", *extra) for _ in range(n)]


def report(proc) -> dict[str, int]:  # type: ignore[no-untyped-def]
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def started(where: Path, name: str) -> int:
    """The pid of the worker that started ``name`` (its body marks each start with a file)."""
    return int(wait_until(lambda: next((p.name.split(".")[1] for p in where.glob(f"{name}.*")), None),
                          timeout=60, what=f"a worker to start {name}"))


def test_eight_processes_enqueue_one_identity_and_it_runs_once(worker_env) -> None:  # type: ignore[no-untyped-def]
    with spawning("tests.programs.task_enqueuer", worker_env) as start:
        procs = [start("enqueue", "7") for _ in range(8)]
        for proc in procs:
            assert json.loads(proc.stdout.readline())["event"] == "ready"
        for proc in procs:  # released together
            proc.stdin.write("go\n")
            proc.stdin.flush()
        ids = {json.loads(proc.stdout.readline())["id"] for proc in procs}
    assert len(ids) == 1 and Task.objects.count() == 1
    with spawning("django", worker_env) as start:
        reports = [report(p) for p in workers(start, 2)]
    assert sum(r["succeeded"] for r in reports) == 1
    assert Effect.objects.filter(task_key="charge:7").count() == 1
    assert tasks.charge.get_result(ids.pop()).status == TaskResultStatus.SUCCESSFUL


def test_a_worker_killed_mid_task_is_replaced_after_its_lease_and_the_effect_lands_once(
        worker_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = tasks.charge.enqueue(1, amount=5)
    others = [tasks.add.enqueue(i, i) for i in range(10)]
    env = {**worker_env, "TASKCLAIM_TEST_STARTED_DIR": str(tmp_path), "TASKCLAIM_TEST_HOLD_FIRST": "30"}
    with spawning("django", env) as start:
        procs = workers(start, 3)
        victim = started(tmp_path, "charge-1")
        os.kill(victim, signal.SIGKILL)
        for proc in procs:
            proc.wait(timeout=120)
    assert Effect.objects.filter(task_key="charge:1").count() == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 2
    assert [a.outcome for a in Attempt.objects.filter(task_id=int(result.id)).order_by("token")] == [
        "taken_over", "succeeded"]
    assert result.errors[0].exception_class_path == "django_taskclaim.exceptions.WorkerLost"
    for other in others:
        other.refresh()
        assert other.status == TaskResultStatus.SUCCESSFUL


def test_a_worker_paused_past_its_lease_is_fenced_off_when_it_wakes(worker_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = tasks.effect.enqueue("paused")
    env = {**worker_env, "TASKCLAIM_TEST_STARTED_DIR": str(tmp_path), "TASKCLAIM_TEST_HOLD_FIRST": "3"}
    with spawning("django", env) as start:
        procs = workers(start, 2)
        paused = started(tmp_path, "paused")
        os.kill(paused, signal.SIGSTOP)
        wait_until(lambda: Task.objects.filter(pk=int(result.id), status="succeeded").exists(), timeout=60,
                   what="another worker to take the task over and finish it")
        os.kill(paused, signal.SIGCONT)  # it wakes: its fenced() effect is refused
        reports = {p.pid: report(p) for p in procs}
    assert Effect.objects.filter(task_key="paused").count() == 1
    assert reports[paused]["fenced_off"] == 1
    assert Task.objects.get(pk=int(result.id)).fencing_token == 2


def test_a_task_whose_last_attempt_dies_ends_failed_and_strands_nothing(worker_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = tasks.last_chance.enqueue("last")
    env = {**worker_env, "TASKCLAIM_TEST_STARTED_DIR": str(tmp_path), "TASKCLAIM_TEST_HOLD_FIRST": "30"}
    with spawning("django", env) as start:
        [victim_proc] = workers(start, 1)
        os.kill(started(tmp_path, "last"), signal.SIGKILL)
        victim_proc.wait(timeout=60)
        # A worker started later, with no reclaim sweep anywhere: it must end the task FAILED
        # (after the dead worker's lease) and return, not wait for it for ever.
        [after] = workers(start, 1)
        summary = report(after)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    assert [e.exception_class_path for e in result.errors] == ["django_taskclaim.exceptions.WorkerLost"]
    assert summary == {"succeeded": 0, "failed": 0, "fenced_off": 0, "unrecorded": 0}
    assert Task.objects.get(pk=int(result.id)).error == "lease expired with no attempts left"


def test_tasks_claimed_by_key_are_never_taken_by_a_queue_worker(worker_env) -> None:  # type: ignore[no-untyped-def]
    """Issue 24's reproduction: an expired run_once task and an enqueue_once row were taken by
    ``taskclaim_worker some.handler``, which stored its own result. Neither kind of worker may."""
    expire(Task.objects.claim("charge-by-run-once", owner="run_once", lease=30).claim)
    Task.objects.ensure("celery-row", dispatch={"task": "shop.charge", "args": [], "kwargs": {}})
    expire(Task.objects.claim("thread-1:3:node", owner="langgraph").claim)
    with spawning("django", worker_env) as start:
        handler = start("taskclaim_worker", "tests.programs.worker_handlers.effect", "--until-drained", "--json")
        django_tasks = start("taskclaim_worker", "--until-drained", "--json")
        assert report(handler) == report(django_tasks) == {
            "succeeded": 0, "failed": 0, "fenced_off": 0, "unrecorded": 0}
    assert not Effect.objects.exists()
    owners = dict(Task.objects.values_list("key", "owner"))
    assert owners == {"charge-by-run-once": "run_once", "celery-row": "", "thread-1:3:node": "langgraph"}
    assert Counter(Task.objects.values_list("fencing_token", flat=True)) == Counter({1: 2, 0: 1})
