"""What the logs say: each line about a task names it in its message (its path where it has one,
its id and key), not only in ``extra``; a worker says once, as it starts, what it runs."""

from __future__ import annotations

import logging
import threading

import pytest

from django_taskclaim.exceptions import StaleClaim
from django_taskclaim.ids import task_id
from django_taskclaim.models import Task
from django_taskclaim.worker import work
from tests.conftest import expire

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "shop.tasks.send_receipt"


def lines(caplog: pytest.LogCaptureFixture, start: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "django_taskclaim" and r.getMessage().startswith(start)]


def named(task: Task) -> str:
    """How a line names a queued task of a path: the path, then its id and key."""
    return f"{PATH} id={task_id(task._state.db, task.pk)} key={task.key!r}"


@pytest.fixture
def queued() -> Task:
    return Task.objects.ensure("receipt-7", tenant="acme", queue="default", task_path=PATH)


def test_claimed_and_completed_name_the_task(caplog, queued) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="django_taskclaim")
    [claim] = Task.objects.claim_next(path="*", owner="w1")
    claim.complete("ok")
    [claimed] = lines(caplog, "task claimed")
    assert claimed == f"task claimed: {named(queued)} tenant='acme' token=1 owner='w1'"
    [completed] = lines(caplog, "task completed")
    assert completed == f"task completed: {named(queued)} tenant='acme' token=1 owner='w1'"
    record = next(r for r in caplog.records if r.getMessage().startswith("task completed"))
    assert (record.key, record.tenant, record.token, record.task_path) == ("receipt-7", "acme", 1, PATH)  # type: ignore[attr-defined]
    assert record.task_id == task_id(queued._state.db, queued.pk)  # type: ignore[attr-defined]


def test_failed_released_taken_over_and_fenced_off_name_the_task(caplog, queued) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="django_taskclaim")
    [first] = Task.objects.claim_next(path="*", owner="w1")
    first.release()
    [second] = Task.objects.claim_next(path="*", owner="w2")
    second.fail(ValueError("smtp down"), retry=True, delay=0)
    [third] = Task.objects.claim_next(path="*", owner="w3", lease=60)
    expire(third)
    [fourth] = Task.objects.claim_next(path="*", owner="w4")
    with pytest.raises(StaleClaim):
        third.complete("late")
    who = named(queued)
    assert lines(caplog, "task released") == [f"task released: {who} tenant='acme' token=1 owner='w1'"]
    assert lines(caplog, "task failed") == [
        f"task failed, to be retried: {who} tenant='acme' token=2 owner='w2': ValueError: smtp down"]
    assert lines(caplog, "task taken over") == [
        f"task taken over: {who} tenant='acme' token=4 owner='w4' (from 'w3')"]
    assert lines(caplog, "fenced-off") == [f"fenced-off complete refused: {who} tenant='acme' token=3 owner='w3'"]
    assert fourth.token == 4


def test_a_task_claimed_by_key_is_named_by_its_id_and_key(caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="django_taskclaim")
    claim = Task.objects.claim("report:42", owner="w1").claim
    assert claim is not None
    claim.fail("no data")
    task = Task.objects.get()
    assert lines(caplog, "task claimed") == [
        f"task claimed: id={task_id(task._state.db, task.pk)} key='report:42' tenant='' token=1 owner='w1'"]
    assert lines(caplog, "task failed") == [
        f"task failed: id={task_id(task._state.db, task.pk)} key='report:42' tenant='' token=1 owner='w1': no data"]


def handle(claim):  # type: ignore[no-untyped-def]
    return "done"


def test_a_worker_logs_one_start_up_line(caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="django_taskclaim")
    stop = threading.Event()
    stop.set()  # starts, says so, stops
    work(handle, owner="w9", queue=["default", "emails"], lease=45, batch=4, stop=stop)
    [line] = lines(caplog, "worker ")
    databases = ", ".join(Task.objects.databases())
    assert line == (f"worker 'w9' started: handler tests.core.test_logs.handle, queues default, emails; "
                    f"databases {databases}; lease 45s; batch 4 (one task at a time)")
    record = next(r for r in caplog.records if r.getMessage().startswith("worker "))
    assert record.queues == ["default", "emails"] and record.lease == 45.0 and record.batch == 4  # type: ignore[attr-defined]


def test_a_django_task_worker_names_its_backend(caplog) -> None:  # type: ignore[no-untyped-def]
    from django_taskclaim.tasks.runner import TaskRunner

    caplog.set_level(logging.INFO, logger="django_taskclaim")
    stop = threading.Event()
    stop.set()
    work(TaskRunner("default"), owner="w8", queue="emails", tenant="acme", stop=stop)
    [line] = lines(caplog, "worker ")
    assert line.startswith("worker 'w8' started: Django tasks of backend 'default', queues emails; databases ")
    assert line.endswith("; tenant 'acme'; lease 30s; batch 1 (one task at a time)")


def test_a_duplicate_delivery_names_the_task_and_its_state(caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="django_taskclaim")
    claim = Task.objects.claim("report:43", owner="w1", lease=60).claim
    assert claim is not None
    assert not Task.objects.claim("report:43", owner="w2").claimed
    task = Task.objects.get()
    assert lines(caplog, "duplicate delivery") == [
        f"duplicate delivery: id={task_id(task._state.db, task.pk)} key='report:43' tenant='' "
        "(the task is running, token 1) from owner 'w2'"]
