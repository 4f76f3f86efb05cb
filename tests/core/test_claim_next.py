"""Queue-style claims: order, limits, tenants, takeover of expired leases."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction

from django_taskclaim.exceptions import StaleClaim
from django_taskclaim.models import Attempt, Task
from tests.conftest import expire

pytestmark = pytest.mark.django_db


def test_claims_the_oldest_pending_first_up_to_limit() -> None:
    for i in range(5):
        Task.objects.ensure(f"t{i}", queue="default")
    first = Task.objects.claim_next(owner="w", limit=2)
    assert [c.key for c in first] == ["t0", "t1"]
    assert all(c.token == 1 and c.owner == "w" for c in first)
    assert [c.key for c in Task.objects.claim_next(limit=10)] == ["t2", "t3", "t4"]
    assert Task.objects.claim_next() == []
    assert Task.objects.running().count() == 5
    assert Attempt.objects.filter(outcome="running").count() == 5


def test_expired_leases_are_taken_over_before_pending_work() -> None:
    Task.objects.ensure("old", queue="default")
    (old,) = Task.objects.claim_next(owner="w1")
    Task.objects.ensure("new", queue="default")
    expire(old)
    (taken,) = Task.objects.claim_next(owner="w2")
    assert (taken.key, taken.token) == ("old", 2)
    assert Attempt.objects.get(token=1, task__key="old").outcome == "taken_over"
    assert [c.key for c in Task.objects.claim_next()] == ["new"]


@pytest.mark.django_db(transaction=True)  # tasks_reclaimed is sent on commit
def test_an_expired_task_on_its_last_attempt_ends_failed_in_the_queue_claim() -> None:
    """Issue 24: a queue without a reclaim sweep strands nothing. The expired task on its last
    attempt is not taken over, and not left RUNNING: the claim ends it FAILED, recorded as
    reclaim would (the attempt expired, ``tasks_reclaimed`` sent)."""
    from django_taskclaim.signals import tasks_reclaimed

    Task.objects.ensure("job", max_attempts=1, queue="default")
    Task.objects.ensure("next", queue="default")
    (claim,) = Task.objects.claim_next()
    expire(claim)
    heard: list[object] = []
    tasks_reclaimed.connect(lambda tasks, **kw: heard.extend(tasks), weak=False, dispatch_uid="heard")
    try:
        assert [c.key for c in Task.objects.claim_next(limit=5)] == ["next"]
    finally:
        tasks_reclaimed.disconnect(dispatch_uid="heard")
    task = Task.objects.get(key="job")
    assert (task.status, task.error, task.lease_expires_at) == ("failed", "lease expired with no attempts left", None)
    assert Attempt.objects.get(task=task).outcome == "expired"
    assert heard == [("job", "", 1, "failed")]
    assert Task.objects.reclaim_expired() == 0 and Task.objects.claim_next() == []


def test_queues_priorities_and_not_before() -> None:
    """Only the named queues' due tasks, the highest priority first, then the oldest."""
    import datetime as dt

    from django.utils import timezone

    Task.objects.ensure("low", queue="mail", priority=-5)
    Task.objects.ensure("urgent", queue="mail", priority=50)
    Task.objects.ensure("normal-1", queue="mail")
    Task.objects.ensure("normal-2", queue="mail")
    Task.objects.ensure("later", queue="mail", priority=100, run_after=timezone.now() + dt.timedelta(hours=1))
    Task.objects.ensure("other", queue="reports", priority=100)
    assert Task.objects.claim_next() == []  # nothing in the default queue
    assert [c.key for c in Task.objects.claim_next(queue="mail", limit=10)] == ["urgent", "normal-1", "normal-2", "low"]
    assert [c.key for c in Task.objects.claim_next(queue=["mail", "reports"], limit=10)] == ["other"]
    Task.objects.filter(key="later").update(run_after=timezone.now() - dt.timedelta(seconds=1))
    (later,) = Task.objects.claim_next(queue="mail")
    assert (later.key, later.queue) == ("later", "mail")


def test_tasks_claimed_by_key_are_never_handed_out() -> None:
    """Issue 24: a queue worker took over an expired run_once task and stored its own handler's
    result. Tasks of claim()/run_once, the Celery bridge and LangGraph nodes have no queue."""
    expire(Task.objects.claim("charge", owner="run_once").claim)
    Task.objects.ensure("celery-row", dispatch={"task": "shop.charge"})
    Task.objects.ensure("plain")
    assert Task.objects.claim_next(limit=10) == []
    assert Task.objects.claim_next(queue=["default", "celery", "mail"], limit=10, path="*") == []
    assert Task.objects.get(key="charge").fencing_token == 1


def test_work_for_a_handler_and_tasks_that_name_their_callable_are_kept_apart() -> None:
    Task.objects.ensure("for-a-handler", queue="default")
    Task.objects.ensure("a-django-task", queue="default", task_path="shop.tasks.charge")
    assert [c.key for c in Task.objects.claim_next(limit=5)] == ["for-a-handler"]
    assert [c.key for c in Task.objects.claim_next(limit=5, path="*")] == ["a-django-task"]


@pytest.mark.parametrize(("options", "problem"), [
    ({"queue": ""}, "queue name"), ({"queue": "x" * 101}, "queue"), ({"queue": "a\x00b"}, "queue"),
    ({"queue": "q", "priority": 101}, "priority"), ({"queue": "q", "priority": 1.5}, "priority"),
    ({"queue": "q", "run_after": __import__("datetime").datetime(2030, 1, 1)}, "aware"),
    ({"priority": 3}, "give a queue"), ({"queue": "q", "task_path": "x" * 256}, "task_path"),
])
def test_bad_queue_options_are_refused_and_nothing_is_stored(options: dict[str, object], problem: str) -> None:
    from django_taskclaim.exceptions import InvalidArgument

    with pytest.raises(InvalidArgument, match=problem):
        Task.objects.ensure("job", **options)
    assert not Task.objects.exists()


@pytest.mark.parametrize("queue", ["", [], ["ok", ""], 7])
def test_claim_next_refuses_bad_queue_names(queue: object) -> None:
    from django_taskclaim.exceptions import InvalidArgument

    with pytest.raises(InvalidArgument):
        Task.objects.claim_next(queue=queue)  # type: ignore[arg-type]


def test_tenant_filter() -> None:
    Task.objects.ensure("a", tenant="acme", queue="default")
    Task.objects.ensure("b", tenant="globex", queue="default")
    assert [c.tenant for c in Task.objects.claim_next(tenant="globex", limit=5)] == ["globex"]
    assert [c.tenant for c in Task.objects.claim_next(tenant="acme", limit=5)] == ["acme"]
    assert Task.objects.claim_next(tenant="acme") == []


def test_finished_and_running_tasks_are_skipped() -> None:
    Task.objects.ensure("done", queue="default")
    Task.objects.claim_next()[0].complete(1)
    Task.objects.ensure("busy", queue="default")
    Task.objects.claim_next()
    assert Task.objects.claim_next(limit=5) == []


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_bad_limit(limit: object) -> None:
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        Task.objects.claim_next(limit=limit)  # type: ignore[arg-type]


def claimed_beside(limit: int) -> list[str]:
    """The keys another worker's ``claim_next(limit=limit)`` takes, on a connection of its own in a
    thread, while this thread's transaction is open: it must pass over the rows held here, never
    wait for them."""
    out: dict[str, list[str]] = {}

    def other_worker() -> None:
        try:
            out["keys"] = [c.key for c in Task.objects.claim_next(limit=limit)]
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_worker, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "claim_next waited for a row lock instead of skipping the row"
    return out["keys"]


@pytest.mark.django_db(transaction=True)
def test_a_locked_row_is_skipped_not_waited_for() -> None:
    """PostgreSQL, MySQL: claim_next passes over a row another transaction holds (SKIP LOCKED)."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has one writer: there is no row lock to skip")
    Task.objects.ensure("held", queue="default")
    Task.objects.ensure("free", queue="default")
    with transaction.atomic():
        Task.objects.select_for_update().get(key="held")  # another claimer, mid-transaction
        keys = claimed_beside(5)
    assert keys == ["free"]


@pytest.mark.django_db(transaction=True)
def test_a_claim_mid_transaction_locks_only_what_it_took() -> None:
    """PostgreSQL, MySQL: a claim whose transaction is still open holds only the task it took; a
    racing claim takes the next one. On MySQL/MariaDB the claim once sorted the queue's backlog and
    kept every row it sorted locked (migration 0009): the racer skipped them all and came away empty,
    which under a concurrency limit left a free place unclaimed (issue 33)."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has one writer: the racer waits for the first claim's commit")
    for n in range(6):
        Task.objects.ensure(f"t{n}", queue="default")
    with transaction.atomic():
        assert [c.key for c in Task.objects.claim_next(limit=1)] == ["t0"]  # not committed yet
        keys = claimed_beside(2)
    assert keys == ["t1", "t2"]


@pytest.mark.django_db(transaction=True)  # the starts commit, as a worker's do
def test_a_reserving_claim_starts_only_its_first_task_and_a_death_charges_only_that_one() -> None:
    """Issue 30, item 1 (in one process): a worker's batch (``reserve=True``) starts the first task
    to run and reserves the others, for a few seconds, their attempt not counted and no attempt
    open. A worker that dies then charges the started task only (taken over: WorkerLost); the
    reserved ones come back with their attempt count unchanged."""
    from datetime import timedelta

    from django.utils import timezone

    from django_taskclaim.lifecycle.claim import RESERVATION

    for i in range(3):
        Task.objects.ensure(f"plain{i}", queue="default", max_attempts=3)
    Task.objects.ensure("urgent", queue="default", priority=10, max_attempts=3)
    sent = timezone.now()
    claims = Task.objects.claim_next(owner="dies", lease=60, limit=4, reserve=True)
    assert [(c.key, c.reserved) for c in claims] == [
        ("urgent", False), ("plain0", True), ("plain1", True), ("plain2", True)]
    assert [c.attempt for c in claims] == [1, 1, 1, 1]  # what each counts once started
    rows = {t.key: t for t in Task.objects.all()}
    assert {k: t.attempts for k, t in rows.items()} == {"urgent": 1, "plain0": 0, "plain1": 0, "plain2": 0}
    assert [(a.task.key, a.token) for a in Attempt.objects.select_related("task")] == [("urgent", 1)]
    # Reserved: held for RESERVATION seconds, not the 60 s lease (a dead worker's come back soon).
    assert all(rows[f"plain{i}"].lease_expires_at <= sent + timedelta(seconds=RESERVATION + 2) for i in range(3))
    assert rows["urgent"].lease_expires_at >= sent + timedelta(seconds=50)
    # The worker dies running "urgent": every lease runs out, another worker takes all four over.
    for claim in claims:
        expire(claim)
    again = Task.objects.claim_next(owner="next", lease=60, limit=4)
    assert sorted(c.key for c in again) == ["plain0", "plain1", "plain2", "urgent"]
    assert {t.key: t.attempts for t in Task.objects.all()} == {"urgent": 2, "plain0": 1, "plain1": 1, "plain2": 1}
    assert list(Attempt.objects.filter(outcome="taken_over").values_list("task__key", flat=True)) == ["urgent"]


@pytest.mark.django_db(transaction=True)
def test_a_reserved_claim_starts_in_the_commit_of_the_task_before_it_or_on_its_own() -> None:
    """The next task of a batch starts in the ending of the one before (``then_start``: no round trip
    of its own); one whose reservation another worker took over is not started, nor run; one given
    back unstarted keeps its attempt count."""
    for name in ("a", "b", "c", "d"):
        Task.objects.ensure(name, queue="default")
    a, b, c, d = Task.objects.claim_next(owner="w", lease=60, limit=4, reserve=True)
    a.then_start(b)
    a.complete("done")
    assert b.started_by(a) is True and not b.reserved
    assert Task.objects.get(key="b").attempts == 1
    assert Attempt.objects.get(task__key="b").outcome == "running"
    expire(c)  # c's reservation ran out, and a rival took it over meanwhile
    assert Task.objects.claim_next(owner="rival", lease=60)[0].key == "c"
    b.then_start(c)
    b.fail("boom", retry=True)
    assert c.started_by(b) is False and c.reserved
    with pytest.raises(StaleClaim):
        c.start()
    assert Task.objects.get(key="c").attempts == 1  # the rival's attempt only
    d.release()  # given back unstarted: its attempt count unchanged, no attempt row
    assert (Task.objects.get(key="d").status, Task.objects.get(key="d").attempts) == ("pending", 0)
    assert not Attempt.objects.filter(task__key="d").exists()
    (d,) = Task.objects.claim_next(owner="w", lease=60, limit=1, reserve=True)
    assert not d.reserved and d.attempt == 1  # a claim of one starts it
    Task.objects.ensure("e", queue="default")
    Task.objects.ensure("f", queue="default")
    _, f = Task.objects.claim_next(owner="w", lease=60, limit=2, reserve=True)
    f.complete("ran unstarted")  # never run a reserved claim; one that ran all the same is counted
    assert (Task.objects.get(key="f").attempts, Attempt.objects.get(task__key="f").outcome) == (1, "succeeded")
