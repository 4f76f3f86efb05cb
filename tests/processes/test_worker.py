"""The queue worker's one-commit loop: complete_and_claim_next, work(), manage.py taskclaim_worker."""

from __future__ import annotations

import io
import json
import signal
from collections import Counter
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from devtools.polling import wait_until
from django_taskclaim.exceptions import InvalidResult, StaleClaim
from django_taskclaim.models import Attempt, Task
from django_taskclaim.worker import work
from tests.conftest import expire
from tests.testapp.models import Effect


def queue(n: int, prefix: str = "t") -> list[str]:
    keys = [f"{prefix}{i:03d}" for i in range(n)]
    for i, key in enumerate(keys):
        Task.objects.ensure(key, payload={"n": i}, queue="default")
    return keys


@pytest.mark.django_db
def test_complete_and_claim_next_completes_then_claims_the_next_in_order() -> None:
    queue(4)
    [first] = Task.objects.claim_next(owner="w")
    assert first.key == "t000" and first.payload == {"n": 0}
    nxt = first.complete_and_claim_next({"ok": 0}, limit=2)
    assert [c.key for c in nxt] == ["t001", "t002"]
    assert all(c.owner == "w" and c.lease == first.lease for c in nxt)
    done = Task.objects.get(key="t000")
    assert done.status == Task.Status.SUCCEEDED and done.result == {"ok": 0}
    assert list(Task.objects.running().order_by("key").values_list("key", flat=True)) == ["t001", "t002"]
    outcomes = dict(Attempt.objects.values_list("task__key", "outcome"))
    assert outcomes == {"t000": "succeeded", "t001": "running", "t002": "running"}


@pytest.mark.django_db
def test_complete_and_claim_next_is_one_statement_on_postgresql(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    queue(3)
    [first] = Task.objects.claim_next(owner="w")
    # PostgreSQL: one statement (and so one commit); elsewhere complete + claim_next, one transaction.
    with django_assert_num_queries({"postgresql": 1, "sqlite": 6}.get(connection.vendor, 7)):
        assert [c.key for c in first.complete_and_claim_next()] == ["t001"]


@pytest.mark.django_db
def test_the_last_task_completes_with_nothing_left_to_claim() -> None:
    queue(1)
    [only] = Task.objects.claim_next(owner="w")
    assert only.complete_and_claim_next("done") == []
    assert Task.objects.get(key="t000").status == Task.Status.SUCCEEDED


@pytest.mark.django_db
def test_a_fenced_off_completion_claims_nothing() -> None:
    queue(3)
    [mine] = Task.objects.claim_next(owner="w", lease=30)
    expire(mine)
    assert [c.key for c in Task.objects.claim_next(owner="thief")] == ["t000"]  # the expired one first
    with pytest.raises(StaleClaim):
        mine.complete_and_claim_next("late", limit=2)
    assert Task.objects.get(key="t000").owner == "thief"
    assert Task.objects.pending().count() == 2  # nothing claimed for the fenced-off worker


@pytest.mark.django_db
def test_an_unstorable_result_writes_nothing_and_claims_nothing() -> None:
    queue(2)
    [mine] = Task.objects.claim_next(owner="w")
    with pytest.raises(InvalidResult):
        mine.complete_and_claim_next({"bad": {1, 2}})
    assert Task.objects.get(key="t000").status == Task.Status.RUNNING
    assert Task.objects.pending().count() == 1


@pytest.mark.django_db
def test_the_running_task_itself_is_never_claimed_again_by_its_completion() -> None:
    queue(1)
    [mine] = Task.objects.claim_next(owner="w", lease=30)
    expire(mine)  # its own lease ran out, nobody took over: the completion still counts
    assert mine.complete_and_claim_next() == []
    assert Task.objects.get(key="t000").status == Task.Status.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_work_drains_the_queue_retries_failures_and_fails_unstorable_results() -> None:
    queue(6)
    seen: Counter[str] = Counter()

    def handler(claim):  # type: ignore[no-untyped-def]
        seen[claim.key] += 1
        if claim.key == "t002" and claim.attempt == 1:
            raise RuntimeError("flaky")
        if claim.key == "t004":
            return {"unstorable": {1}}
        return {"n": claim.payload["n"]}

    stats = work(handler, owner="w", batch=2, until_drained=True)
    # Tasks by their end (t002 once, as succeeded); its failed first attempt apart, as retried.
    assert (stats.succeeded, stats.failed, stats.fenced_off, stats.retried) == (5, 1, 0, 1)
    assert seen == Counter({"t002": 2, "t000": 1, "t001": 1, "t003": 1, "t004": 1, "t005": 1})
    states = dict(Task.objects.values_list("key", "status"))
    assert states.pop("t004") == Task.Status.FAILED  # ran once, its result refused, never run again
    assert set(states.values()) == {Task.Status.SUCCEEDED}
    assert Task.objects.get(key="t003").result == {"n": 3}


@pytest.mark.django_db(transaction=True)
def test_work_atomic_rolls_back_the_handlers_writes_with_a_failure() -> None:
    queue(2)

    def handler(claim):  # type: ignore[no-untyped-def]
        Effect.objects.create(task_key=claim.key, token=claim.token, worker="w")
        if claim.key == "t001":
            raise RuntimeError("after the write")
        return "ok"

    stats = work(handler, owner="w", atomic=True, until_drained=True, max_tasks=2)
    assert (stats.succeeded, stats.failed, stats.retried) == (1, 0, 1)  # t001 failed an attempt, not for good
    assert list(Effect.objects.values_list("task_key", flat=True)) == ["t000"]
    assert Task.objects.get(key="t001").status == Task.Status.PENDING  # retried later, attempt 1 of 5


@pytest.mark.django_db(transaction=True)
def test_a_handler_that_ends_its_claim_itself_is_not_completed_again() -> None:
    queue(3)
    ran: Counter[str] = Counter()

    def handler(claim):  # type: ignore[no-untyped-def]
        ran[claim.key] += 1
        if claim.key == "t001":
            claim.fail("no endpoint spec", retry=False)  # ended FAILED by the handler: counted failed
            return "ignored"
        with claim.fenced():  # the publish and the completion commit together, once
            Effect.objects.create(task_key=claim.key, token=claim.token, worker="w")
            claim.complete({"published": claim.key}, result_ref=f"suites/{claim.key}.py")
        return "ignored"

    stats = work(handler, owner="w", until_drained=True)
    assert (stats.succeeded, stats.failed, stats.fenced_off) == (2, 1, 0)
    assert ran == Counter({"t000": 1, "t001": 1, "t002": 1})
    tasks = {t.key: t for t in Task.objects.all()}
    assert tasks["t001"].status == Task.Status.FAILED and tasks["t001"].error == "no endpoint spec"
    assert (tasks["t002"].result, tasks["t002"].result_ref) == ({"published": "t002"}, "suites/t002.py")
    assert sorted(Effect.objects.values_list("task_key", flat=True)) == ["t000", "t002"]
    # One completion per task: the worker did not store its own result over the handler's.
    assert Attempt.objects.filter(outcome=Attempt.Outcome.SUCCEEDED).count() == 2
    assert Attempt.objects.filter(stale_writes__gt=0).count() == 0


@pytest.mark.django_db(transaction=True)
def test_worker_command_reports_and_rejects_a_bad_handler(capsys) -> None:  # type: ignore[no-untyped-def]
    queue(3)
    call_command("taskclaim_worker", "tests.programs.worker_handlers.effect", "--until-drained", "--json", "--atomic")
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {
        "succeeded": 3, "failed": 0, "fenced_off": 0, "unrecorded": 0}
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="cannot be imported"):
        call_command("taskclaim_worker", "tests.programs.worker_handlers.nowhere")


def start_workers(processes, env: dict[str, str], n: int, handler: str, *extra: str):  # type: ignore[no-untyped-def]
    return [processes.start("django", "taskclaim_worker", handler, "--lease", "2", "--until-drained", "--json", *extra,
                            env=env) for _ in range(n)]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_four_atomic_workers_and_a_sigkill_apply_every_effect_once(processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    keys = queue(3, prefix="slow") + queue(60)
    # A slow task's first attempt holds its transaction 5 s: long enough to be killed inside it,
    # short enough that the two not killed do not keep the run waiting (on SQLite they hold the
    # write lock, one after the other).
    env = {"TASKCLAIM_TEST_STARTED_DIR": str(tmp_path), "TASKCLAIM_TEST_HOLD": "5"}
    workers = start_workers(processes, env, 4, "tests.programs.worker_handlers.effect", "--atomic")
    # A worker holds a slow key's first attempt: kill it there, mid-transaction.
    victim_pid = int(wait_until(lambda: next((p.name.split(".")[2] for p in tmp_path.glob("slow*.1.*")), None),
                                timeout=60, what="a worker to start a slow task"))
    next(proc for proc in workers if proc.pid == victim_pid).kill()
    processes.join(timeout=120)
    effects = Counter(Effect.objects.values_list("task_key", flat=True))
    assert effects == Counter(dict.fromkeys(keys, 1)), "some effect missing or applied twice"
    assert set(Task.objects.values_list("status", flat=True)) == {Task.Status.SUCCEEDED}
    killed = [p for p in workers if p.returncode == -signal.SIGKILL]
    assert len(killed) == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_paused_past_its_lease_is_fenced_off_on_waking(processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    keys = queue(1, prefix="slow") + queue(20)
    env = {"TASKCLAIM_TEST_STARTED_DIR": str(tmp_path), "TASKCLAIM_TEST_HOLD": "3"}
    workers = start_workers(processes, env, 3, "tests.programs.worker_handlers.fenced_effect")
    pid = int(wait_until(lambda: next((p.name.split(".")[2] for p in tmp_path.glob("slow000.1.*")), None),
                         timeout=60, what="a worker to start the slow task"))
    paused = next(proc for proc in workers if proc.pid == pid)
    paused.stop()
    # Past its 2 s lease another worker takes the task over (attempt 2) and finishes it.
    wait_until(lambda: Task.objects.filter(key="slow000", status=Task.Status.SUCCEEDED).exists(), timeout=60,
               what="the slow task to be taken over and finished")
    paused.cont()  # it wakes, then its fenced() effect is refused
    reports = {proc.pid: proc.finish(120) for proc in workers}
    effects = Counter(Effect.objects.values_list("task_key", flat=True))
    assert effects == Counter(dict.fromkeys(keys, 1))
    assert Task.objects.get(key="slow000").fencing_token == 2
    assert reports[pid]["fenced_off"] == 1
    assert sum(r["succeeded"] for r in reports.values()) == len(keys)


@pytest.mark.django_db(transaction=True)
def test_a_batched_claim_taken_over_while_it_waited_is_not_run_again() -> None:
    """With batch > 1 the leases of a batch start together. A task whose lease ran out while an
    earlier one of its batch ran, and which another worker took over, must not run here too."""
    queue(2, prefix="b")
    ran: list[str] = []

    def handler(claim):  # type: ignore[no-untyped-def]
        ran.append(claim.key)
        if claim.key == "b000":
            # Slow work: the second task's lease runs out meanwhile, and a rival takes it over.
            wait_until(lambda: Task.objects.expired().filter(key="b001").exists(), timeout=10,
                       interval=0.02, what="b001's lease to run out")
            # The expired task first (b000 is kept alive by its heartbeats).
            assert [c.key for c in Task.objects.claim_next(owner="rival", lease=60)] == ["b001"]
        return "done"

    stats = work(handler, owner="batcher", lease=0.5, batch=2, max_tasks=2)
    assert ran == ["b000"]
    assert (stats.succeeded, stats.fenced_off) == (1, 1)
    b001 = Task.objects.get(key="b001")
    assert b001.status == Task.Status.RUNNING and b001.owner == "rival"


@pytest.mark.django_db(transaction=True)
def test_a_batched_claim_that_waited_long_is_renewed_before_it_runs() -> None:
    queue(2, prefix="r")
    leases: dict[str, object] = {}

    def handler(claim):  # type: ignore[no-untyped-def]
        leases[claim.key] = Task.objects.get(key=claim.key).lease_expires_at
        if claim.key == "r000":
            wait_until(lambda: Task.objects.expired().filter(key="r001").exists(), timeout=10,
                       interval=0.02, what="r001's lease to run out")
        return "done"

    from datetime import timedelta

    from django.utils import timezone

    # Before the batch's claim (the database's clock is this host's): its statement ran after this.
    before = timezone.now()
    stats = work(handler, owner="batcher", lease=0.5, batch=2, max_tasks=2)
    assert (stats.succeeded, stats.fenced_off) == (2, 0)
    assert Task.objects.filter(key__in=["r000", "r001"], status=Task.Status.SUCCEEDED).count() == 2
    # r001 ran on a renewed lease: later than the one its batch's claim had set (r001 was reserved
    # by that claim, and started, its attempt opened, when r000 completed, past that first lease).
    # (Not measured from r000's attempt start: on MySQL that row is written by a statement after the
    # claim's, a few milliseconds later than the reservation's lease was counted from.)
    claimed_at = Attempt.objects.get(task__key="r000", token=1).started_at
    assert leases["r001"] > claimed_at + timedelta(seconds=0.5)  # type: ignore[operator]
    assert Attempt.objects.get(task__key="r001", token=1).started_at >= before + timedelta(seconds=0.5)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_handler_that_kills_its_worker_charges_only_its_own_task(processes) -> None:  # type: ignore[no-untyped-def]
    """Issue 30, item 1, for a handler worker (``taskclaim_worker HANDLER --batch 4 --lease 1``,
    restarted after each death): only the task that started is charged for the death."""
    Task.objects.ensure("killer", queue="default", priority=10, max_attempts=3)
    plain = queue(3, prefix="plain")
    Task.objects.filter(key__in=plain).update(max_attempts=3)
    codes = []
    for _ in range(5):
        worker = processes.start("django", "taskclaim_worker", "tests.programs.worker_handlers.kills_itself_or_counts",
                                 "--batch", "4", "--lease", "1", "--until-drained", "--json")
        codes.append(worker.wait(timeout=60))
        if codes[-1] == 0:
            break
    assert codes == [-signal.SIGKILL] * 3 + [0]
    killer = Task.objects.get(key="killer")
    assert (killer.status, killer.attempts) == (Task.Status.FAILED, 3)
    assert {t.key: (t.status, t.attempts) for t in Task.objects.filter(key__in=plain)} == dict.fromkeys(
        plain, (Task.Status.SUCCEEDED, 1))
    assert not Attempt.objects.filter(task__key__in=plain).exclude(outcome="succeeded").exists()
    assert Counter(Effect.objects.values_list("task_key", flat=True)) == dict.fromkeys(plain, 1)


@pytest.mark.django_db(transaction=True)
def test_the_next_task_of_a_batch_starts_in_the_completion_before_it(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    """Starting a reserved task costs no round trip of its own: on PostgreSQL the completion of the
    task before it and its start are one statement (one commit)."""
    queue(2, prefix="s")
    first, second = Task.objects.claim_next(owner="w", limit=2, reserve=True)
    first.then_start(second)
    with django_assert_num_queries({"postgresql": 1, "sqlite": 6}.get(connection.vendor, 7)):
        first.complete("done")
    assert second.started_by(first) is True
    assert Task.objects.get(key="s001").attempts == 1


def serve_lane(job) -> None:  # type: ignore[no-untyped-def]
    """One lane's loop on a thread of its own, as the worker runs it: the thread's connection is
    closed when it ends (left open, its session outlives the test until garbage collection, and a
    later test that counts the server's sessions waits for it in vain)."""
    from django.db import connections

    from django_taskclaim.worker import _serve

    try:
        _serve(job, None, "default")
    finally:
        connections.close_all()


def lane_job(budget, concurrency: int, wait: float):  # type: ignore[no-untyped-def]
    """What one lane of a worker over several task databases shares with the others: the budget."""
    import threading

    from django_taskclaim.worker import HandlerRunner, _Job

    return _Job(runner=HandlerRunner(lambda claim: claim.key), owner="w", lease=30, tenant=None, queues=["default"],
                batch=3, wait=wait, until_drained=False, stop=threading.Event(), budget=budget,
                concurrency=concurrency)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("concurrency", [1, 2])
def test_max_tasks_held_for_a_moment_by_another_lane_is_waited_for_not_taken_as_spent(concurrency: int) -> None:
    """Two lanes share ``max_tasks``; the other lane's claim (on a database with nothing to claim)
    holds all that is left at the instant this lane asks. This lane waits for that claim's answer:
    given back, it is this lane's to claim. It used to take the held budget for spent and stop for
    good, its tasks unclaimed, while the empty lane polled for ever (the CI hang of
    test_max_tasks_counts_the_tasks_of_every_lane)."""
    import threading

    from django_taskclaim.worker import _Budget

    queue(5)
    budget = _Budget(3)
    held = budget.take(3)  # the other lane's claim, in flight
    job = lane_job(budget, concurrency, wait=30.0)
    lane = threading.Thread(target=serve_lane, args=(job,), daemon=True)
    lane.start()
    wait_until(lambda: not lane.is_alive() or getattr(budget, "waiting", 0), timeout=30,
               what="the lane to ask for its share of max_tasks")
    assert lane.is_alive(), "the lane took budget held by another lane's claim for spent, and stopped"
    budget.settle(held, 0)  # that claim found nothing: all of it back
    lane.join(30)
    assert not lane.is_alive(), "the lane did not end once it had claimed max_tasks"
    assert job.stats.succeeded == 3 and Task.objects.filter(status=Task.Status.SUCCEEDED).count() == 3
    assert Task.objects.filter(status=Task.Status.PENDING).count() == 2 and budget.spent()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_lane_with_nothing_to_claim_ends_once_the_other_lanes_claimed_max_tasks(concurrency: int) -> None:
    """The empty lane: while another lane's claims hold the budget it waits; once they spent it
    (claimed ``max_tasks``) it ends, within its poll, rather than poll for ever."""
    import threading

    from django_taskclaim.worker import _Budget

    budget = _Budget(2)
    held = budget.take(2)
    job = lane_job(budget, concurrency, wait=0.05)
    lane = threading.Thread(target=serve_lane, args=(job,), daemon=True)
    lane.start()
    budget.settle(held, 1)  # one claimed, one given back: the empty lane takes it, claims nothing, gives it back
    held = budget.take(1, wait=30)
    assert held == 1
    budget.settle(held, 1)  # the other lane claimed it: max_tasks claimed
    lane.join(30)
    assert not lane.is_alive(), "the empty lane polled on after the other lanes had claimed max_tasks"
    assert job.stats.handled == 0 and budget.spent()


@pytest.mark.django_db(transaction=True)
def test_the_summary_counts_a_task_retried_then_succeeded_once_as_succeeded() -> None:
    """A task whose first attempt failed and whose second succeeded is one task succeeded, not one
    succeeded and one failed; its failed attempt is counted apart, as ``retried``. A task that fails
    for good is the one ``failed``."""
    Task.objects.ensure("flaky", queue="default", max_attempts=3)
    Task.objects.ensure("broken", queue="default", max_attempts=2)
    out = io.StringIO()
    call_command("taskclaim_worker", "tests.programs.worker_handlers.fails_its_first_attempt", "--until-drained",
                 "--json", stdout=out)
    assert json.loads(out.getvalue()) == {"succeeded": 1, "failed": 1, "fenced_off": 0, "unrecorded": 0,
                                          "retried": 2}
    tasks = {t.key: (t.status, t.attempts) for t in Task.objects.all()}
    assert tasks == {"flaky": (Task.Status.SUCCEEDED, 2), "broken": (Task.Status.FAILED, 2)}
    out = io.StringIO()
    Task.objects.ensure("flaky-2", queue="default", max_attempts=3)
    call_command("taskclaim_worker", "tests.programs.worker_handlers.fails_its_first_attempt", "--until-drained",
                 stdout=out)
    assert out.getvalue().strip() == ("taskclaim_worker: 1 succeeded, 0 failed, 0 fenced off, 0 unrecorded, "
                                      "1 failed attempts retried")


@pytest.mark.django_db(transaction=True)
def test_until_drained_due_leaves_deferred_tasks_and_the_plain_flag_waits_for_them(processes) -> None:  # type: ignore[no-untyped-def]
    """``--until-drained=due`` ends once nothing is due or running: a task deferred an hour ahead is
    left pending for a later run (the plain flag would wait that hour). The plain ``--until-drained``
    waits for deferred tasks (one due in a second here: it is run, then the worker ends)."""
    import datetime as dt

    from django.utils import timezone

    handler, env = "tests.programs.worker_handlers.effect", {"TASKCLAIM_TEST_POLL_INTERVAL": "0.05"}
    Task.objects.ensure("now", queue="default")
    Task.objects.ensure("in-an-hour", queue="default", run_after=timezone.now() + dt.timedelta(hours=1))
    due = processes.start("django", "taskclaim_worker", "--until-drained=due", handler, "--json", env=env)
    assert due.finish(60)["succeeded"] == 1
    assert dict(Task.objects.values_list("key", "status")) == {"now": "succeeded", "in-an-hour": "pending"}
    Task.objects.filter(key="in-an-hour").update(run_after=timezone.now() + dt.timedelta(seconds=1))
    drained = processes.start("django", "taskclaim_worker", "--until-drained", handler, "--json", env=env)
    assert drained.finish(60)["succeeded"] == 1
    assert Task.objects.get(key="in-an-hour").status == Task.Status.SUCCEEDED


def test_until_drained_takes_due_or_nothing() -> None:
    from django_taskclaim.exceptions import InvalidArgument

    with pytest.raises(InvalidArgument, match="until_drained must be True, False or 'due', not 'all'"):
        work(lambda claim: None, until_drained="all")
