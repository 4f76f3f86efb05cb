"""What an operator of Django tasks does from Python: cancel and retry by result id
(``ClaimBackend.cancel``/``retry`` and their awaitable twins), and the one mapping between the
task table's statuses and the framework's (a cancelled task reads FAILED, with an error that
says it was cancelled)."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from django_taskclaim.exceptions import InvalidTransition, StaleClaim, TaskCancelled
from django_taskclaim.ids import parse_task_id
from django_taskclaim.models import Task
from django_taskclaim.status import RESULT_STATUS, Status, reported_as
from django_taskclaim.tasks.compat import TaskResultDoesNotExist, TaskResultStatus, task_backends
from django_taskclaim.tasks.results import STATUS
from django_taskclaim.tasks.runner import TaskRunner
from django_taskclaim.worker import work
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def backend():  # type: ignore[no-untyped-def]
    return task_backends["default"]


def drain() -> object:
    return work(TaskRunner("default"), owner="tester", until_drained=True, poll=0.02)


def test_one_mapping_covers_every_status_and_every_framework_status() -> None:
    assert set(RESULT_STATUS) == set(Status.values)
    assert {str(v) for v in STATUS.values()} == set(TaskResultStatus.values)
    assert {k: str(v) for k, v in STATUS.items()} == RESULT_STATUS  # the results use that mapping
    assert RESULT_STATUS[Status.CANCELLED] == "FAILED"
    assert reported_as("FAILED") == (Status.FAILED.value, Status.CANCELLED.value)
    assert reported_as("READY") == (Status.PENDING.value,)
    with pytest.raises(ValueError, match="'DONE' is not a status of Django's Tasks framework"):
        reported_as("DONE")


def test_cancel_by_result_id_reads_failed_with_a_cancelled_error() -> None:
    result = tasks.add.enqueue(1, 2)
    cancelled = backend().cancel(result.id)
    assert cancelled.id == result.id and cancelled.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in cancelled.errors] == [TaskCancelled]
    assert "cancelled" in cancelled.errors[0].traceback
    assert Task.objects.get().status == Status.CANCELLED
    assert tasks.add.get_result(result.id) == cancelled  # get_result says the same
    assert drain().handled == 0  # type: ignore[attr-defined]  # nothing runs it


def test_cancel_fences_off_the_running_owner() -> None:
    result = tasks.add.enqueue(1, 2)
    [claim] = Task.objects.claim_next(path="*", owner="w1")
    assert backend().cancel(result.id).status == TaskResultStatus.FAILED
    with pytest.raises(StaleClaim):
        claim.complete(3)
    after = tasks.add.get_result(result.id)
    assert after.worker_ids == ["w1"] and [e.exception_class for e in after.errors] == [TaskCancelled]


def test_retry_by_result_id_runs_a_failed_task_again_under_the_same_id() -> None:
    result = tasks.attempt_number.enqueue(fail_until=5)
    drain()
    assert tasks.attempt_number.get_result(result.id).status == TaskResultStatus.FAILED
    retried = backend().retry(result.id)
    assert retried.id == result.id and retried.status == TaskResultStatus.READY
    assert retried.attempts == 0 and retried.errors == []  # counted afresh
    # A cancelled one too.
    other = tasks.add.enqueue(2, 2)
    backend().cancel(other.id)
    assert backend().retry(other.id).status == TaskResultStatus.READY
    drain()
    assert tasks.add.get_result(other.id).return_value == 4


def test_cancel_and_retry_refuse_a_task_in_another_state_and_name_it() -> None:
    done = tasks.add.enqueue(1, 1)
    drain()
    with pytest.raises(InvalidTransition, match=r"SUCCESSFUL \(succeeded\).*only a READY or RUNNING task"):
        backend().cancel(done.id)
    waiting = tasks.add.enqueue(1, 1)
    with pytest.raises(InvalidTransition, match=r"READY \(pending\).*only a FAILED task"):
        backend().retry(waiting.id)
    assert Task.objects.get(pk=parse_task_id(done.id)[1]).status == Status.SUCCEEDED


def test_cancel_and_retry_of_an_unknown_id_or_of_work_that_is_not_a_django_task() -> None:
    by_key = Task.objects.ensure("not-a-django-task")
    for call in (backend().cancel, backend().retry):
        for bad in ("999999", "nope", str(by_key.pk)):
            with pytest.raises(TaskResultDoesNotExist):
                call(bad)
    assert Task.objects.get().status == Status.PENDING


def test_the_awaitable_twins() -> None:
    result = tasks.add.enqueue(1, 2)
    assert async_to_sync(backend().acancel)(result.id).status == TaskResultStatus.FAILED
    assert async_to_sync(backend().aretry)(result.id).status == TaskResultStatus.READY
