"""Every per-task option of ``ClaimBackend`` is honoured, and in its order: a task's own
``claim_options(...)``, then the backend's ``OPTIONS``, then the ``TASKCLAIM_*`` setting — for the
lease, the attempts and the retry backoff (issue 30, item 14: a task's own lease or backoff could
be ignored without any test failing). Each test reads what the claim or the row got."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from django_taskclaim.models import Task
from django_taskclaim.tasks import enqueue_many
from django_taskclaim.tasks.compat import TaskResultStatus
from django_taskclaim.tasks.results import parse_result_id
from django_taskclaim.tasks.runner import TaskRunner
from django_taskclaim.worker import work
from tests.testapp import option_tasks, tasks

pytestmark = pytest.mark.django_db(transaction=True)

#: The test suite's backend without its OPTIONS (tests/settings.py gives it a quick BACKOFF).
BARE = {"BACKEND": "django_taskclaim.tasks.ClaimBackend", "QUEUES": ["default", "emails"]}


def backend(**options: Any) -> dict[str, Any]:
    return {"default": {**BARE, "OPTIONS": options}}


def run(task: Any) -> Any:
    """Enqueue ``task`` and run it (every attempt, until it ends) as ``taskclaim_worker`` would."""
    result = task.enqueue()
    work(TaskRunner("default"), owner="tester", until_drained=True, poll=0.02)
    result.refresh()
    return result


def fail_once(task: Any) -> float:
    """Run one attempt of ``task`` (enqueued before) that fails: the seconds until its retry may run."""
    [claim] = Task.objects.claim_next(path="*")
    TaskRunner("default").execute(claim, lambda held, value: held.complete(value))
    row = Task.objects.using(claim.using).get(pk=claim.task_id)
    assert row.status == Task.Status.PENDING and row.run_after is not None
    return (row.run_after - row.updated_at).total_seconds()


def row_of(result: Any) -> Any:
    """The task row of a result (its id is ``alias:pk`` where tasks are spread over databases)."""
    using, pk = parse_result_id(result.id)
    return Task.objects.using(using).get(pk=pk)


def due_now(result: Any) -> None:
    """Make a retried task due (a second back: the database's clock may round its now down)."""
    import datetime as dt

    from django.utils import timezone

    row = row_of(result)
    Task.objects.using(row._state.db).filter(pk=row.pk).update(run_after=timezone.now() - dt.timedelta(seconds=1))


# -- lease --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("task", "seconds"), [(option_tasks.long_lease, 120), (option_tasks.short_lease, 5)])
def test_a_tasks_own_lease_is_its_claims_longer_or_shorter_than_the_workers(task: Any, seconds: float) -> None:
    result = run(task)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value["lease"] == seconds
    assert seconds - 3 < result.return_value["left"] <= seconds  # the database's lease, not only the claim's


def test_without_its_own_lease_a_task_gets_the_backends_option_then_the_setting() -> None:
    assert run(option_tasks.default_lease).return_value["lease"] == 30  # TASKCLAIM_DEFAULT_LEASE's default
    with override_settings(TASKS=backend(LEASE=45)):
        got = run(option_tasks.default_lease).return_value
        assert got["lease"] == 45 and 42 < got["left"] <= 45
        assert run(option_tasks.long_lease).return_value["lease"] == 120  # its own comes first
    with override_settings(TASKS=backend(), TASKCLAIM_DEFAULT_LEASE=55):
        got = run(option_tasks.default_lease).return_value
        assert got["lease"] == 55 and 52 < got["left"] <= 55


def test_the_worker_commands_lease_is_the_workers_and_a_tasks_own_still_wins() -> None:
    import io

    from django.core.management import call_command

    plain, own = option_tasks.default_lease.enqueue(), option_tasks.long_lease.enqueue()
    call_command("taskclaim_worker", "--until-drained", "--lease", "40", stdout=io.StringIO())
    plain.refresh()
    own.refresh()
    assert (plain.return_value["lease"], own.return_value["lease"]) == (40, 120)


# -- backoff ------------------------------------------------------------------------------------
@override_settings(TASKCLAIM_RETRY_BACKOFF={"base": 7, "jitter": 0})
def test_a_tasks_own_backoff_comes_before_the_backends_and_the_setting() -> None:
    result = option_tasks.own_backoff.enqueue()
    assert fail_once(option_tasks.own_backoff) == pytest.approx(500, abs=0.5)  # attempt 1: base
    due_now(result)
    assert fail_once(option_tasks.own_backoff) == pytest.approx(1000, abs=0.5)  # attempt 2: base * factor


@override_settings(TASKCLAIM_RETRY_BACKOFF={"base": 7, "jitter": 0})
def test_without_its_own_backoff_a_task_gets_the_backends_option_then_the_setting() -> None:
    option_tasks.plain_failure.enqueue()
    assert 0.025 - 0.001 <= fail_once(option_tasks.plain_failure) <= 0.05 + 0.001  # OPTIONS: base 0.05, jitter 0.5
    Task.objects.all().delete()
    with override_settings(TASKS=backend()):
        result = option_tasks.plain_failure.enqueue()
        assert fail_once(option_tasks.plain_failure) == pytest.approx(7, abs=0.01)
        due_now(result)
        assert fail_once(option_tasks.plain_failure) == pytest.approx(14, abs=0.01)
    with override_settings(TASKS=backend(BACKOFF={"base": 3, "factor": 3, "jitter": 0})):
        option_tasks.plain_failure.enqueue()
        assert fail_once(option_tasks.plain_failure) == pytest.approx(3, abs=0.01)


# -- attempts -----------------------------------------------------------------------------------
def test_max_attempts_is_the_tasks_own_then_the_backends_option_then_the_setting() -> None:
    def stored(task: Any, bulk: bool = False) -> int:
        result = enqueue_many(task, [((), {})])[0] if bulk else task.enqueue()
        return row_of(result).max_attempts

    for bulk in (False, True):
        assert (stored(option_tasks.two_attempts, bulk), stored(option_tasks.plain_failure, bulk)) == (2, 5)
        with override_settings(TASKS=backend(MAX_ATTEMPTS=7)):
            assert (stored(option_tasks.two_attempts, bulk), stored(option_tasks.plain_failure, bulk)) == (2, 7)
        with override_settings(TASKS=backend(), TASKCLAIM_MAX_ATTEMPTS=4):
            assert (stored(option_tasks.two_attempts, bulk), stored(option_tasks.plain_failure, bulk)) == (2, 4)


def test_a_task_runs_as_many_attempts_as_it_declares() -> None:
    result = run(option_tasks.two_attempts)
    assert (result.status, result.attempts, len(result.errors)) == (TaskResultStatus.FAILED, 2, 2)
    keyed = tasks.charge.enqueue(1)  # claim_options(max_attempts=3) under @keyed
    assert row_of(keyed).max_attempts == 3


# -- which work the tasks worker takes ------------------------------------------------------------
def test_the_tasks_worker_takes_no_handler_work_and_drains_without_waiting_for_it() -> None:
    """The direction test_django_tasks.py does not cover: a handler's queued work in the same queue
    is never claimed by the Django tasks worker (``path="*"``), and does not keep its
    ``--until-drained`` from ending."""
    import threading

    Task.objects.ensure("for-a-handler", queue="default")
    result = tasks.add.enqueue(2, 2)
    stop = threading.Event()
    watchdog = threading.Timer(30, stop.set)  # a drain that waits for the handler's work would never end
    watchdog.start()
    try:
        stats = work(TaskRunner("default"), owner="tester", until_drained=True, poll=0.02, stop=stop)
    finally:
        watchdog.cancel()
    assert not stop.is_set(), "the drain waited for work that is not the tasks worker's"
    assert (stats.succeeded, stats.failed) == (1, 0)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    handler_work = Task.objects.get(key="for-a-handler")
    assert (handler_work.status, handler_work.fencing_token, handler_work.attempts) == (Task.Status.PENDING, 0, 0)


def test_the_worker_without_queue_takes_every_queue_of_its_backend_and_only_those() -> None:
    """``taskclaim_worker`` with no ``--queue``: the backend's ``QUEUES`` (here ``default`` and
    ``emails``), not only the default queue, and no queue the backend does not name."""
    import io

    from django.core.management import call_command

    email = tasks.send_email.enqueue("a@example.com")  # @task(queue_name="emails")
    plain = tasks.add.enqueue(1, 2)
    Task.objects.ensure("elsewhere", queue="reports", task_path="tests.testapp.tasks.add", payload={"args": [1, 1]})
    call_command("taskclaim_worker", "--until-drained", stdout=io.StringIO())
    for result in (email, plain):
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    assert Task.objects.get(key="elsewhere").status == Task.Status.PENDING
