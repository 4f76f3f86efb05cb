"""``ClaimBackend``: Django's Tasks framework (``django.tasks``, or the backport on Django 5.2)
on the task table, run by ``taskclaim_worker`` in this process. The framework's own behaviour
(defer, priority, queues, results, errors, async tasks, context) and what the backend adds
(identity, retries, fencing). Races and faults with real processes: test_django_tasks_processes.py."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_taskclaim.exceptions import InvalidTaskKey, PayloadMismatch
from django_taskclaim.models import Attempt, Task
from django_taskclaim.tasks import ClaimBackend, enqueue_many
from django_taskclaim.tasks.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_taskclaim.tasks.runner import TaskRunner
from django_taskclaim.worker import work
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def drain(queue: str | list[str] = "default", **options: object) -> object:
    """Run the tasks of ``queue`` until none is left unfinished, as ``taskclaim_worker`` does."""
    return work(TaskRunner("default"), owner="tester", queue=queue, until_drained=True, poll=0.02, **options)


def test_the_backend_says_what_it_supports() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, ClaimBackend)
    assert (backend.supports_defer, backend.supports_async_task, backend.supports_get_result,
            backend.supports_priority) == (True, True, True, True)


def test_enqueue_returns_what_get_result_reads_and_the_id_is_the_rows() -> None:
    result = tasks.add.enqueue(2, 3)
    row = Task.objects.get()
    assert result.id == str(row.pk) and row.queue == "default" and row.task_path == "tests.testapp.tasks.add"
    assert result.status == TaskResultStatus.READY and result.args == [2, 3] and result.kwargs == {}
    assert (result.started_at, result.finished_at, result.attempts, result.errors) == (None, None, 0, [])
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018
    assert tasks.add.get_result(result.id) == result
    assert task_backends["default"].get_result(result.id) == result
    result.refresh()
    assert result.status == TaskResultStatus.READY


def test_a_worker_runs_it_and_the_result_says_how() -> None:
    result = tasks.add.enqueue(2, 3)
    stats = drain()
    assert stats.succeeded == 1  # type: ignore[attr-defined]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5
    assert result.enqueued_at <= result.started_at <= result.last_attempted_at <= result.finished_at
    assert result.attempts == 1 and result.worker_ids == ["tester"] and result.errors == []


def test_async_task_functions_run() -> None:
    result = tasks.add_async.enqueue(4, 5)
    drain()
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 9)


def test_takes_context_gets_the_attempt_number_and_every_error_stays_readable() -> None:
    """Retried after the backoff: the first two attempts fail, the third succeeds."""
    result = tasks.attempt_number.enqueue(fail_until=2)
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"attempt": 3, "id": result.id}
    assert result.attempts == 3 and len(result.worker_ids) == 3
    assert [e.exception_class for e in result.errors] == [RuntimeError, RuntimeError]
    assert result.errors[0].traceback.endswith("RuntimeError: attempt 1 fails\n")
    assert result.errors[1].traceback.endswith("RuntimeError: attempt 2 fails\n")
    outcomes = list(Attempt.objects.order_by("token").values_list("outcome", "error_class"))
    assert outcomes == [("retry", "builtins.RuntimeError"), ("retry", "builtins.RuntimeError"), ("succeeded", "")]


def test_a_failure_waits_for_its_backoff_before_the_retry() -> None:
    result = tasks.attempt_number.enqueue(fail_until=1)
    [claim] = Task.objects.claim_next(path="*")
    from django_taskclaim.lifecycle.execution import execute

    TaskRunner("default").execute(claim, lambda c, v: c.complete(v))
    row = Task.objects.get()
    assert row.status == "pending" and row.run_after is not None and row.run_after > row.updated_at
    assert Task.objects.claim_next(path="*") == []  # not before run_after
    assert execute  # the protocol the runner ran it by
    Task.objects.update(run_after=timezone.now() - dt.timedelta(seconds=1))
    assert [c.task_id for c in Task.objects.claim_next(path="*")] == [int(result.id)]


def test_a_failing_task_ends_failed_after_its_attempts_with_every_error() -> None:
    result = tasks.fails.enqueue("boom")
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 5
    assert len(result.errors) == 5 and all(e.exception_class is ValueError for e in result.errors)
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018


def test_system_exit_in_a_task_is_its_failure_not_the_workers() -> None:
    result = tasks.exits.using(queue_name="default").enqueue()
    other = tasks.add.enqueue(1, 1)
    drain()
    result.refresh()
    other.refresh()
    assert result.status == TaskResultStatus.FAILED and result.errors[-1].exception_class is SystemExit
    assert other.status == TaskResultStatus.SUCCESSFUL  # the worker went on


def test_a_return_value_that_is_not_json_fails_the_task_once() -> None:
    result = tasks.returns_a_set.enqueue()
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1  # never run again
    assert result.errors[0].exception_class is TypeError


def test_queues_and_priority() -> None:
    low = tasks.ordered.using(priority=-10).enqueue("low")
    high = tasks.ordered.using(priority=50).enqueue("high")
    mid = tasks.ordered.enqueue("mid")
    email = tasks.send_email.enqueue("a@example.com")
    drain("default")
    assert list(Effect.objects.order_by("id").values_list("task_key", flat=True)) == [
        "order:high", "order:mid", "order:low"]
    email.refresh()
    assert email.status == TaskResultStatus.READY  # another queue: not this worker's
    drain("emails")
    email.refresh()
    assert email.status == TaskResultStatus.SUCCESSFUL and email.return_value == "sent to a@example.com"
    for result in (low, high, mid):
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL


def test_a_deferred_task_runs_once_its_time_has_come() -> None:
    later = tasks.add.using(run_after=timezone.now() + dt.timedelta(seconds=0.5)).enqueue(1, 2)
    now = tasks.add.enqueue(3, 4)
    assert [c.task_id for c in Task.objects.claim_next(path="*", limit=5)] == [int(now.id)]
    Task.objects.filter(pk=int(now.id)).update(status="pending", owner="", lease_expires_at=None)
    drain()
    later.refresh()
    assert later.status == TaskResultStatus.SUCCESSFUL and later.started_at >= later.task.run_after
    assert later.task.run_after is not None  # the result carries the task as enqueued


def test_a_keyed_task_is_enqueued_once_per_identity() -> None:
    first = tasks.charge.enqueue(7, amount=10)
    again = tasks.charge.enqueue(7, amount=10)
    assert again.id == first.id and Task.objects.count() == 1
    row = Task.objects.get()
    assert (row.tenant, row.key) == ("acme", "order-7:charge")
    with pytest.raises(PayloadMismatch):
        tasks.charge.enqueue(7, amount=99)  # the same identity with other arguments
    drain()
    done = tasks.charge.enqueue(7, amount=10)
    assert done.id == first.id and done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == "charged 10"  # completed inside fenced(): what it stored
    assert Effect.objects.filter(task_key="charge:7").count() == 1


def test_after_a_failure_a_keyed_task_is_reused_or_run_again_as_it_declares() -> None:
    failed = tasks.stays_failed.enqueue(1)
    drain()
    again = tasks.stays_failed.enqueue(1)
    assert again.id == failed.id and again.status == TaskResultStatus.FAILED  # REUSE: the failure stands
    first = tasks.flaky_once.enqueue(1)
    drain()
    first.refresh()
    assert first.status == TaskResultStatus.FAILED
    rerun = tasks.flaky_once.enqueue(1)  # RUN_AGAIN: reset under the same id
    assert rerun.id == first.id and rerun.status == TaskResultStatus.READY
    assert (rerun.attempts, rerun.errors) == (0, [])  # a new run counts its attempts afresh
    drain()
    rerun.refresh()
    assert (rerun.status, rerun.return_value) == (TaskResultStatus.SUCCESSFUL, 1)
    assert (rerun.attempts, rerun.errors) == (1, [])
    assert Attempt.objects.filter(task_id=int(rerun.id)).count() == 2  # the audit trail keeps both runs'


def test_a_queued_keyed_task_is_never_claimed_by_key() -> None:
    """run_once (and claim()) of a queued Django task's key is refused, as enqueue() of a key claimed
    by key is: the task's own function runs, and its result is the function's."""
    from django_taskclaim import TaskKey, run_once

    result = tasks.charge.enqueue(5, amount=3)
    key = TaskKey("charge", run="order-5", tenant="acme")
    with pytest.raises(InvalidTaskKey, match="already names other work: tests.testapp.tasks.charge"):
        run_once(key, lambda: "not the task's function")
    with pytest.raises(InvalidTaskKey, match="already names other work"):
        Task.objects.claim(key)
    Task.objects.ensure("order-6:charge", tenant="acme")  # the reverse, refused as before
    with pytest.raises(InvalidTaskKey, match="already names other work: a task claimed by key"):
        tasks.charge.enqueue(6, amount=3)
    drain()
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, "charged 3")
    assert Effect.objects.filter(task_key="charge:5").count() == 1


def test_a_keyed_call_is_one_identity_and_payload_however_its_arguments_are_spelled() -> None:
    """The arguments are compared as bound to the task's signature: by keyword or by position, in
    any order, a default left out or spelled out, they are one call (and one task)."""
    first = tasks.charge.enqueue(order_id=7, amount=10)
    for again in (tasks.charge.enqueue(7, 10), tasks.charge.enqueue(7, amount=10),
                  tasks.charge.enqueue(amount=10, order_id=7)):
        assert again.id == first.id
    defaulted = tasks.charge.enqueue(8)  # amount=0, its default
    assert tasks.charge.enqueue(8, 0).id == tasks.charge.enqueue(order_id=8, amount=0).id == defaulted.id
    assert Task.objects.count() == 2
    for other in ((7, 11), (7, 10.0), (8, 1)):  # other values (10.0 is not 10 in JSON): other work
        with pytest.raises(PayloadMismatch):
            tasks.charge.enqueue(*other)
    results = enqueue_many(tasks.charge, [((7, 10), {}), ((), {"amount": 0, "order_id": 8}), ((9,), {}),
                                          ((), {"order_id": 9, "amount": 0})])
    assert [r.id for r in results[:2]] == [first.id, defaulted.id] and results[2].id == results[3].id
    assert first.kwargs == {"order_id": 7, "amount": 10} and first.args == []  # as first enqueued
    drain()
    assert tasks.charge.enqueue(7, 10).return_value == "charged 10"
    assert Effect.objects.filter(task_key="charge:7").count() == 1


def test_a_row_of_the_previous_release_is_compared_as_bound_too() -> None:
    """Rows keep the fingerprint of their arguments as first spelled (the previous release's rule
    too): a later spelling of the same call is compared by binding both to the signature."""
    stored = {"args": [], "kwargs": {"order_id": 4, "amount": 2}}
    row = Task.objects.ensure("order-4:charge", tenant="acme", payload=stored, queue="default",
                              task_path="tests.testapp.tasks.charge")
    assert tasks.charge.enqueue(4, 2).id.rpartition(":")[2] == str(row.pk)
    assert Task.objects.get(pk=row.pk).payload == stored  # untouched
    with pytest.raises(PayloadMismatch):
        tasks.charge.enqueue(4, 3)


def test_the_bound_form_of_a_call() -> None:
    from django_taskclaim.tasks.identity import bound_call

    def f(context: object, a: int, b: int = 2, *rest: int, c: object = object(), **more: int) -> None: ...

    same = [bound_call(f, True, {"args": args, "kwargs": kwargs})
            for args, kwargs in (([1], {}), ([1, 2], {}), ([], {"a": 1, "b": 2}), ([1], {"b": 2}))]
    assert len(set(same)) == 1 and same[0] is not None
    assert bound_call(f, True, {"args": [1, 2, 3], "kwargs": {}}) != same[0]  # *rest
    assert bound_call(f, True, {"args": [1], "kwargs": {"d": 4}}) != same[0]  # **more
    assert bound_call(f, True, {"args": [1], "kwargs": {"c": 4}}) != same[0]  # c's default is no JSON: left out
    assert bound_call(f, True, {"args": [], "kwargs": {}}) is None  # no binding: compared as spelled
    assert bound_call(f, False, {"args": [1], "kwargs": {}}) != same[0]  # without a context, it is an argument


def test_an_identity_met_again_reports_the_task_as_stored_not_as_asked() -> None:
    first = tasks.charge.enqueue(8, amount=1)
    again = tasks.charge.using(priority=50).enqueue(8, amount=1)
    assert again.id == first.id and again.task.priority == 0 == Task.objects.get().priority


def test_an_unkeyed_task_is_new_work_on_every_enqueue() -> None:
    assert tasks.add.enqueue(1, 1).id != tasks.add.enqueue(1, 1).id
    assert Task.objects.count() == 2


def test_enqueue_inside_atomic_commits_or_rolls_back_with_the_callers_rows() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue(1, 2)
        Effect.objects.create(task_key="caller's row", token=0, worker="view")
        raise RuntimeError("the view failed")
    assert not Task.objects.exists() and not Effect.objects.exists()
    with transaction.atomic():
        result = tasks.add.enqueue(1, 2)
    assert Task.objects.filter(pk=int(result.id)).exists()


@pytest.mark.parametrize("result_id", ["abc", "999999", "1" * 40, "", "-1"])
def test_an_unknown_id_is_task_result_does_not_exist(result_id: str) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(result_id)


def test_a_row_that_is_not_a_django_task_has_no_result() -> None:
    row = Task.objects.ensure("by-key")
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(str(row.pk))


def test_bad_arguments_and_queues_are_refused_before_anything_is_stored() -> None:
    with pytest.raises(TypeError, match="Unsupported type"):
        tasks.add.enqueue(dt.datetime.now(), 1)
    with pytest.raises(InvalidTask, match="Queue 'nowhere' is not valid"):
        tasks.add.using(queue_name="nowhere")
    assert not Task.objects.exists()


def test_the_frameworks_signals_are_sent() -> None:
    heard: list[tuple[str, str]] = []

    def hear(name: str):  # type: ignore[no-untyped-def]
        return lambda sender, task_result, **kw: heard.append((name, task_result.status))

    receivers = [(task_enqueued, hear("enqueued")), (task_started, hear("started")), (task_finished, hear("finished"))]
    for signal, receiver in receivers:
        signal.connect(receiver, weak=False)
    try:
        tasks.add.enqueue(1, 1)
        drain()
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)
    assert heard == [("enqueued", "READY"), ("started", "RUNNING"), ("finished", "SUCCESSFUL")]


def test_task_finished_carries_the_result_a_task_stored_itself() -> None:
    """The runner reads an execution as every integration does (``Executed.outcome()``): a task
    that completed its claim inside ``fenced()`` finished with what it stored, the value every
    later read of its result returns, not what the function returned afterwards."""
    finished: list[object] = []

    def hear(sender, task_result, **kw):  # type: ignore[no-untyped-def]
        finished.append(task_result.return_value)

    task_finished.connect(hear, weak=False)
    try:
        result = tasks.charge.enqueue(8, amount=5)
        drain()
    finally:
        task_finished.disconnect(hear)
    result.refresh()
    assert finished == [result.return_value] == ["charged 5"]  # the function returned "charged"


def test_handler_work_and_django_tasks_are_kept_apart() -> None:
    """A handler worker never runs a Django task (and the tasks worker no handler's work)."""
    result = tasks.add.enqueue(1, 1)
    Task.objects.ensure("for-a-handler", queue="default")
    ran: list[str] = []
    work(lambda claim: ran.append(claim.key), owner="handler", until_drained=False, max_tasks=1, poll=0.01)
    assert ran == ["for-a-handler"]
    result.refresh()
    assert result.status == TaskResultStatus.READY
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_taskclaim_worker_without_a_handler_runs_the_backends_tasks() -> None:
    result = tasks.add.enqueue(20, 22)
    out = io.StringIO()
    call_command("taskclaim_worker", "--until-drained", "--json", stdout=out)
    assert json.loads(out.getvalue().strip().splitlines()[-1])["succeeded"] == 1
    result.refresh()
    assert result.return_value == 42


@pytest.mark.parametrize(("argv", "problem"), [
    (["--backend", "nowhere"], "--backend 'nowhere'"),
    (["--queue", "unknown"], "not in TASKS"),
    (["--atomic"], "--atomic"),
])
def test_taskclaim_worker_refuses_what_it_cannot_run(argv: list[str], problem: str) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=problem):
        call_command("taskclaim_worker", "--until-drained", *argv)


def test_check_reports_options_it_cannot_honour_and_a_task_database_elsewhere() -> None:
    backend = ClaimBackend("x", {"QUEUES": ["default"], "OPTIONS": {"LEASES": 5, "MAX_ATTEMPTS": 0,
                                                                     "BACKOFF": {"base": -1}}})
    ids = sorted(message.id for message in backend.check())
    assert ids == ["django_taskclaim.E201"] * 3
    assert ClaimBackend("y", {"OPTIONS": {"LEASE": 60}}).check() == []
    # IMPORT_GRACE (issue 30, item 3): seconds, from 0 to 30 days.
    assert ClaimBackend("y", {"OPTIONS": {"IMPORT_GRACE": 0}}).check() == []
    for bad in (-1, "600", True, 10**9):
        [message] = ClaimBackend("g", {"OPTIONS": {"IMPORT_GRACE": bad}}).check()
        assert message.id == "django_taskclaim.E201" and "IMPORT_GRACE" in message.msg
    with override_settings(TASKCLAIM_DATABASE="other"):
        assert [m.id for m in ClaimBackend("z", {}).check()] == ["django_taskclaim.W201"]
    with override_settings(TASKCLAIM_AUDIT=False):
        assert [m.id for m in ClaimBackend("z", {}).check()] == ["django_taskclaim.W202"]


def test_w203_the_backport_outside_installed_apps() -> None:
    from django.conf import settings

    from django_taskclaim.tasks.compat import FRAMEWORK

    if FRAMEWORK != "django_tasks":
        pytest.skip("Django 6 has the framework built in: there is no app to install")
    apps = [app for app in settings.INSTALLED_APPS if app != "django_tasks"]
    with override_settings(INSTALLED_APPS=apps):
        assert [m.id for m in ClaimBackend("z", {}).check()] == ["django_taskclaim.W203"]


def _written_by_a_newer_release(key: str, path: str = "tests.testapp.gone.report") -> Task:
    """A task row as ``ClaimBackend.enqueue`` writes it, for a function this process cannot import."""
    return Task.objects.ensure(key, payload={"args": [7], "kwargs": {}}, queue="default", task_path=path,
                               dispatch={"backend": "default"}, max_attempts=3)


def test_a_task_the_worker_cannot_import_is_given_back_uncharged_and_not_taken_again_at_once() -> None:
    """Issue 30, item 3: in a rolling deploy a worker of the previous release claims a task from a
    module only the new release has. It gives the task back, its attempt not counted, with a "not
    before" time a little later (so that it does not take it again at once), the reason on the task."""
    row = _written_by_a_newer_release("rolling")
    stats = work(TaskRunner("default"), owner="old", until_drained=False, max_tasks=1, poll=0.01,
                 stop=_stop_after_polls(3))
    row.refresh_from_db()
    assert (row.status, row.attempts, row.owner) == (Task.Status.PENDING, 0, "")
    assert row.run_after is not None and row.run_after > timezone.now()
    assert "ModuleNotFoundError" in row.error and "tests.testapp.gone" in row.error
    assert stats.failed == 0
    assert list(Attempt.objects.filter(task=row).values_list("outcome", flat=True)) == ["released"]
    assert Task.objects.claim_next(path="*") == []  # not due again yet
    result = task_backends["default"].get_result(str(row.pk))
    assert (result.status, result.errors) == (TaskResultStatus.READY, [])


def test_a_task_nobody_can_import_fails_after_the_grace_and_get_result_reads_it() -> None:
    """Past ``OPTIONS["IMPORT_GRACE"]`` (counted from the task's enqueue) the task fails for good,
    charged one attempt; ``get_result`` of a task whose function is gone returns its FAILED result
    instead of raising ``ImportError``."""
    row = _written_by_a_newer_release("gone-for-good")
    Task.objects.filter(pk=row.pk).update(created_at=timezone.now() - dt.timedelta(hours=1))
    stats = work(TaskRunner("default"), owner="w", until_drained=False, max_tasks=1, poll=0.01)
    row.refresh_from_db()
    assert (row.status, row.attempts, stats.failed) == (Task.Status.FAILED, 1, 1)
    backend = task_backends["default"]
    result = backend.get_result(str(row.pk))
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["builtins.ModuleNotFoundError"]
    assert result.task.module_path == "tests.testapp.gone.report" and result.args == [7]
    from asgiref.sync import async_to_sync

    assert async_to_sync(backend.aget_result)(str(row.pk)).status == TaskResultStatus.FAILED


@override_settings(TASKS={"default": {"BACKEND": "django_taskclaim.tasks.ClaimBackend",
                                      "QUEUES": ["default", "emails"], "OPTIONS": {"IMPORT_GRACE": 0}}})
def test_an_import_grace_of_zero_fails_at_once() -> None:
    row = _written_by_a_newer_release("no-grace")
    work(TaskRunner("default"), owner="w", until_drained=False, max_tasks=1, poll=0.01)
    row.refresh_from_db()
    assert (row.status, row.attempts) == (Task.Status.FAILED, 1)


def _stop_after_polls(n: int) -> object:
    """A stop event set once a worker has waited ``n`` times for work (nothing due is left)."""
    import threading

    class Stop(threading.Event):
        polls = 0

        def wait(self, timeout: float | None = None) -> bool:
            self.polls += 1
            if self.polls >= n:
                self.set()
            return self.is_set()

    return Stop()
