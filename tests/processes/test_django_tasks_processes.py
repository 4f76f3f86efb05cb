"""ClaimBackend with real processes: 8 processes enqueueing one identity at once, workers
SIGKILLed and SIGSTOPped mid-task, a task whose last attempt dies, and rows of other kinds
(run_once, the Celery bridge, LangGraph nodes) that no queue worker may take."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from devtools.polling import wait_until
from devtools.processes import Child, Supervisor
from django_taskclaim.models import Attempt, Task
from django_taskclaim.tasks.compat import TaskResultStatus
from tests.conftest import expire
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def workers(processes: Supervisor, n: int, *extra: str, env: dict[str, str] | None = None) -> list[Child]:
    """``taskclaim_worker`` processes running the Django tasks of the default queue."""
    return [processes.start("django", "taskclaim_worker", "--lease", "2", "--until-drained", "--json", *extra, env=env)
            for _ in range(n)]


def report(proc: Child) -> dict[str, int]:
    return proc.finish(120)


def started(where: Path, name: str, procs: list[Child]) -> Child:
    """The worker that started ``name`` (its body marks each start with a file named after its pid)."""
    pid = int(wait_until(lambda: next((p.name.split(".")[1] for p in where.glob(f"{name}.*")), None),
                         timeout=60, what=f"a worker to start {name}"))
    return next(proc for proc in procs if proc.pid == pid)


def test_eight_processes_enqueue_one_identity_and_it_runs_once(processes: Supervisor) -> None:
    procs = [processes.start("tests.programs.task_enqueuer", "enqueue", "7") for _ in range(8)]
    processes.go(*procs)  # released together
    ids = {proc.finish(120)["id"] for proc in procs}
    assert len(ids) == 1 and Task.objects.count() == 1
    reports = [report(p) for p in workers(processes, 2)]
    assert sum(r["succeeded"] for r in reports) == 1
    assert Effect.objects.filter(task_key="charge:7").count() == 1
    assert tasks.charge.get_result(ids.pop()).status == TaskResultStatus.SUCCESSFUL


def test_a_worker_killed_mid_task_is_replaced_after_its_lease_and_the_effect_lands_once(
        processes: Supervisor, tmp_path: Path) -> None:
    result = tasks.charge.enqueue(1, amount=5)
    others = [tasks.add.enqueue(i, i) for i in range(10)]
    env = {"TASKCLAIM_TEST_STARTED_DIR": str(tmp_path), "TASKCLAIM_TEST_HOLD_FIRST": "30"}
    procs = workers(processes, 3, env=env)
    started(tmp_path, "charge-1", procs).kill()
    processes.join(timeout=120)
    assert Effect.objects.filter(task_key="charge:1").count() == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 2
    assert [a.outcome for a in Attempt.objects.filter(task_id=int(result.id)).order_by("token")] == [
        "taken_over", "succeeded"]
    assert result.errors[0].exception_class_path == "django_taskclaim.exceptions.WorkerLost"
    for other in others:
        other.refresh()
        assert other.status == TaskResultStatus.SUCCESSFUL


def test_a_worker_paused_past_its_lease_is_fenced_off_when_it_wakes(processes: Supervisor, tmp_path: Path) -> None:
    result = tasks.effect.enqueue("paused")
    env = {"TASKCLAIM_TEST_STARTED_DIR": str(tmp_path), "TASKCLAIM_TEST_HOLD_FIRST": "3"}
    procs = workers(processes, 2, env=env)
    paused = started(tmp_path, "paused", procs)
    paused.stop()
    wait_until(lambda: Task.objects.filter(pk=int(result.id), status="succeeded").exists(), timeout=60,
               what="another worker to take the task over and finish it")
    paused.cont()  # it wakes: its fenced() effect is refused
    reports = {p.pid: report(p) for p in procs}
    assert Effect.objects.filter(task_key="paused").count() == 1
    assert reports[paused.pid]["fenced_off"] == 1
    assert Task.objects.get(pk=int(result.id)).fencing_token == 2


def test_a_task_whose_last_attempt_dies_ends_failed_and_strands_nothing(processes: Supervisor, tmp_path: Path) -> None:
    result = tasks.last_chance.enqueue("last")
    env = {"TASKCLAIM_TEST_STARTED_DIR": str(tmp_path), "TASKCLAIM_TEST_HOLD_FIRST": "30"}
    victim = started(tmp_path, "last", workers(processes, 1, env=env))
    victim.kill()
    victim.wait(timeout=60)
    # A worker started later, with no reclaim sweep anywhere: it must end the task FAILED
    # (after the dead worker's lease) and return, not wait for it for ever.
    [after] = workers(processes, 1, env=env)
    summary = report(after)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    assert [e.exception_class_path for e in result.errors] == ["django_taskclaim.exceptions.WorkerLost"]
    assert summary == {"succeeded": 0, "failed": 0, "fenced_off": 0, "unrecorded": 0}
    assert Task.objects.get(pk=int(result.id)).error == "lease expired with no attempts left"


def restarted_after_each_death(processes: Supervisor, *, batch: int) -> list[int]:
    """Exit codes of ``taskclaim_worker --batch N --lease 1 --until-drained`` runs, one started
    after each death, as a process supervisor would (at most five)."""
    codes: list[int] = []
    for _ in range(5):
        worker = processes.start("django", "taskclaim_worker", "--batch", str(batch), "--lease", "1",
                                 "--until-drained", "--json")
        codes.append(worker.wait(timeout=60))
        if codes[-1] == 0:
            break
    return codes


def test_a_task_that_kills_its_worker_charges_only_itself_not_its_batch_mates(processes: Supervisor) -> None:
    """Issue 30, item 1: a task that SIGKILLs its own worker (priority 10, so it runs first), three
    plain tasks, MAX_ATTEMPTS 3, ``--batch 4 --lease 1``, the worker restarted after each death.
    Only a task that started may be charged for a death: the batch-mates claimed with it and not
    started go back with their attempt count unchanged (they ended FAILED, never run, with
    ``WorkerLost`` × 3, when every claim of a batch counted an attempt)."""
    killer = tasks.kills_its_worker.enqueue()
    plain = [tasks.counted.enqueue(f"plain-{i}") for i in range(3)]
    assert restarted_after_each_death(processes, batch=4) == [-signal.SIGKILL] * 3 + [0]
    killer.refresh()
    assert killer.status == TaskResultStatus.FAILED and killer.attempts == 3
    assert [e.exception_class_path for e in killer.errors] == ["django_taskclaim.exceptions.WorkerLost"] * 3
    for result in plain:
        result.refresh()
        assert (result.status, result.attempts, result.errors) == (TaskResultStatus.SUCCESSFUL, 1, [])
        assert Task.objects.get(pk=int(result.id)).attempts == 1
    assert Counter(Effect.objects.values_list("task_key", flat=True)) == {f"plain-{i}": 1 for i in range(3)}


def test_a_death_in_a_later_batch_charges_only_the_task_that_started(processes: Supervisor) -> None:
    """Issue 30, item 1, past the first batch: the batch that a completion claims in its own
    statement (``complete_and_claim_next``) reserves its batch-mates too. Two tasks of priority 20
    fill the first batch (``--batch 2``); the second completes and claims the killer (priority 10)
    and a plain task: when the killer SIGKILLs the worker, the plain task had not started, and must
    not be charged (it was, with ``WorkerLost``, when only the first batch reserved)."""
    first = [tasks.counted.using(priority=20).enqueue(f"first-{i}") for i in range(2)]
    killer = tasks.kills_its_worker.enqueue()
    later = tasks.counted.using(priority=0).enqueue("later")
    assert restarted_after_each_death(processes, batch=2) == [-signal.SIGKILL] * 3 + [0]
    killer.refresh()
    assert killer.status == TaskResultStatus.FAILED and killer.attempts == 3
    for result in [*first, later]:
        result.refresh()
        assert (result.status, result.attempts, result.errors) == (TaskResultStatus.SUCCESSFUL, 1, []), result.id
    assert Counter(Effect.objects.values_list("task_key", flat=True)) == {"first-0": 1, "first-1": 1, "later": 1}


def test_a_worker_of_the_previous_release_gives_back_a_task_it_cannot_import(processes: Supervisor) -> None:
    """Issue 30, item 3: in a rolling deploy the web tier (this process, the new release) enqueues a
    task from a module only the new release has; a worker of the previous release claims it first.
    It must give the task back uncharged (it ended FAILED after 1 attempt), so that a new enqueue
    (``REUSE``) still finds it waiting, and a worker of the new release then runs it once."""
    from tests.testapp import new_release

    first = new_release.report.enqueue(7)
    old = processes.start("django", "taskclaim_worker", "--json", env={"TASKCLAIM_TEST_OLD_RELEASE": "1"})
    wait_until(lambda: Attempt.objects.filter(task_id=int(first.id), outcome="released").exists(), timeout=30,
               what="the old worker to give the task back")
    old.signal(signal.SIGTERM)
    assert report(old) == {"succeeded": 0, "failed": 0, "fenced_off": 0, "unrecorded": 0}
    again = new_release.report.enqueue(7)  # REUSE: the same task, still waiting to run
    assert (again.id, again.status, again.errors) == (first.id, TaskResultStatus.READY, [])
    assert Task.objects.get(pk=int(first.id)).attempts == 0
    [new] = workers(processes, 1)
    assert report(new)["succeeded"] == 1
    first.refresh()
    assert (first.status, first.attempts, first.return_value) == (TaskResultStatus.SUCCESSFUL, 1, {"report": 7})


def test_tasks_claimed_by_key_are_never_taken_by_a_queue_worker(processes: Supervisor) -> None:
    """Issue 24's reproduction: an expired run_once task and an enqueue_once row were taken by
    ``taskclaim_worker some.handler``, which stored its own result. Neither kind of worker may."""
    expire(Task.objects.claim("charge-by-run-once", owner="run_once", lease=30).claim)
    Task.objects.ensure("celery-row", dispatch={"task": "shop.charge", "args": [], "kwargs": {}})
    expire(Task.objects.claim("thread-1:3:node", owner="langgraph").claim)
    handler = processes.start("django", "taskclaim_worker", "tests.programs.worker_handlers.effect",
                              "--until-drained", "--json")
    django_tasks = processes.start("django", "taskclaim_worker", "--until-drained", "--json")
    assert report(handler) == report(django_tasks) == {
        "succeeded": 0, "failed": 0, "fenced_off": 0, "unrecorded": 0}
    assert not Effect.objects.exists()
    owners = dict(Task.objects.values_list("key", "owner"))
    assert owners == {"charge-by-run-once": "run_once", "celery-row": "", "thread-1:3:node": "langgraph"}
    assert Counter(Task.objects.values_list("fencing_token", flat=True)) == Counter({1: 2, 0: 1})
