"""The Celery bridge in-process: decoration, identity, duplicates, enqueue_once, requeue selection.

No broker is needed here: claimed tasks are called directly (Celery's ``called_directly``),
which runs them under a claim like a worker does. Publishing on commit against a real broker
is tested in ``test_celery.py`` (the queue stays empty until the commit).
"""

from __future__ import annotations

import datetime as dt
import io
import os

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db(transaction=True)


def test_reclaim_command_runs_with_default_verbosity() -> None:
    # Regression: reclaim_round read self.verbosity, which BaseCommand.execute() never sets.
    out = io.StringIO()
    call_command("taskclaim_reclaim", stdout=out)
    assert "reclaim: 0 expired task(s)" in out.getvalue()


try:
    import celery
except ImportError:  # in CI a missing Celery is a failure, not a skip
    if os.environ.get("CI"):
        raise
    pytest.skip("celery is not installed", allow_module_level=True)

from celery.exceptions import Ignore  # noqa: E402
from django.core.management.base import CommandError  # noqa: E402
from django.db import transaction  # noqa: E402
from django.test import override_settings  # noqa: E402

from django_taskclaim import TaskKey  # noqa: E402
from django_taskclaim.celery import ClaimedTask, claimed_task, enqueue_once, requeue_lost  # noqa: E402
from django_taskclaim.claims import ensure  # noqa: E402
from django_taskclaim.exceptions import InvalidTaskKey, TaskFailed  # noqa: E402
from django_taskclaim.models import Attempt, Task  # noqa: E402
from tests.conftest import expire  # noqa: E402
from tests.programs.celery_app import app, work  # noqa: E402
from tests.programs.celery_tasks import always_fails, echo  # noqa: E402
from tests.testapp.models import Effect  # noqa: E402


class Marked(celery.Task):  # a user's own base class
    marker = "mine"


@claimed_task(key="{0}", bind=True, base=Marked)
def taken_over_midway(self, key: str) -> dict[str, str]:
    """Loses its claim while running: another owner takes over and completes first."""
    expire(self.claim.task_id)
    other = Task.objects.claim(key, owner="other-worker", lease=30)
    other.claim.complete({"by": "other"})
    return {"by": "me"}


@claimed_task(key="self-{0}", bind=True)
def completes_itself(self, name: str) -> str:
    with self.claim.fenced():
        Effect.objects.create(task_key=self.claim.key, token=self.claim.token, worker="me")
        self.claim.complete({"stored": name})
    return "returned"


@claimed_task(key=TaskKey("report", run="r1", tenant="acme"))
def report() -> None:
    pass


@claimed_task(key="{0}", tenant=lambda key, tenant: tenant)
def tenanted(key: str, tenant: str) -> None:
    pass


def test_claimed_task_refuses_bad_options() -> None:
    with pytest.raises(ValueError, match="on_busy must be one of"):
        claimed_task(key="x", on_busy="later")
    with pytest.raises(TypeError, match="key must be"):
        claimed_task(key=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_attempts"):
        claimed_task(key="x", max_attempts=0)
    with pytest.raises(ValueError, match="too large"):  # the column holds 2**31 - 1: refused now
        claimed_task(key="x", max_attempts=2**31)
    with pytest.raises(ValueError, match="'order' is not a parameter"):
        claimed_task(key="invoice-{order}")(lambda order_id: None)
    with pytest.raises(ValueError, match="no positional argument 1"):
        claimed_task(key="{1}", bind=True)(lambda self, a: None)
    with pytest.raises(ValueError, match="use named or numbered fields"):
        claimed_task(key="k-{}")(lambda a: None)


def test_key_from_template_callable_and_taskkey() -> None:
    assert work.taskclaim.identity(("n",), {}) == ("work-n", "")
    assert work.taskclaim.identity((), {"name": "n", "seconds": 2}) == ("work-n", "")
    assert echo.taskclaim.identity(("a",), {"value": 3}) == ("echo-a", "")
    assert report.taskclaim.identity((), {}) == ("r1:report", "acme")
    assert tenanted.taskclaim.identity(("k", "acme"), {}) == ("k", "acme")
    with pytest.raises(InvalidTaskKey, match="cannot build the key"):
        work.taskclaim.identity((), {})


def test_both_registration_styles_build_claimed_tasks() -> None:
    assert isinstance(work._get_current_object(), ClaimedTask) and work.app is app  # app.task style
    assert isinstance(echo._get_current_object(), ClaimedTask)  # shared_task style
    combined = taken_over_midway._get_current_object()
    assert isinstance(combined, ClaimedTask) and combined.marker == "mine"


def test_a_duplicate_call_returns_the_stored_result() -> None:
    assert echo("a", {"n": 1}) == {"n": 1}
    assert echo("a", {"n": 2}) == {"n": 1}  # same key: the stored result, the body not run
    assert Effect.objects.filter(task_key="echo-a").count() == 1
    outcomes = list(Attempt.objects.filter(task__key="echo-a").values_list("outcome", flat=True))
    assert outcomes == ["succeeded", "duplicate"]


def test_busy_task_with_skip_is_ignored() -> None:
    assert Task.objects.claim("echo-busy", owner="someone-else", lease=30).claimed
    with pytest.raises(Ignore):
        echo("busy", 1)
    assert not Effect.objects.filter(task_key="echo-busy").exists()


@claimed_task(key="wait-{0}", on_busy="wait")
def waits(name: str) -> str:
    return name


@override_settings(TASKCLAIM_POLL_INTERVAL=0.05)
def test_busy_task_with_wait_takes_over_when_the_lease_runs_out() -> None:
    assert Task.objects.claim("wait-x", owner="gone-worker", lease=0.5).claimed
    assert waits("x") == "x"
    tokens = list(Attempt.objects.filter(task__key="wait-x").order_by("id").values_list("token", "outcome"))
    assert tokens == [(1, "taken_over"), (None, "duplicate"), (2, "succeeded")]


def test_busy_countdown_stays_below_the_visibility_timeout() -> None:
    from django_taskclaim.celery import busy_countdown

    conf = app.conf
    old = conf.broker_url, conf.broker_transport_options
    try:
        conf.update(broker_url="redis://127.0.0.1:1/0", broker_transport_options={"visibility_timeout": 0.4})
        assert busy_countdown(work.taskclaim, app) == 0.2  # its own 0.3 s would be too long
        assert busy_countdown(echo.taskclaim, app) == 0.2
        conf.update(broker_transport_options={})
        assert busy_countdown(work.taskclaim, app) == 0.3  # busy_countdown=0.3
        assert busy_countdown(echo.taskclaim, app) == 15.0  # lease 30 s / 2
        conf.update(broker_url="amqp://guest@127.0.0.1//")
        assert busy_countdown(always_fails.taskclaim, app) == 2.5  # no visibility timeout: lease 5 s / 2
    finally:
        conf.update(broker_url=old[0], broker_transport_options=old[1])


def test_claim_is_only_reachable_in_the_body() -> None:
    with pytest.raises(RuntimeError, match="only available while the task body runs"):
        echo.claim  # noqa: B018


def test_fenced_off_completion_is_refused_and_the_stored_result_returned() -> None:
    assert taken_over_midway("midway") == {"by": "other"}
    task = Task.objects.get(key="midway")
    assert (task.status, task.fencing_token, task.result) == ("succeeded", 2, {"by": "other"})
    mine = Attempt.objects.get(task=task, token=1)
    assert mine.outcome == "taken_over" and mine.stale_writes == 1  # the refused complete()


def test_a_body_that_completes_inside_its_fence_keeps_its_result() -> None:
    assert completes_itself("x") == {"stored": "x"}
    task = Task.objects.get(key="self-x")
    assert task.result == {"stored": "x"}
    assert Attempt.objects.get(task=task).stale_writes == 0


def test_retries_follow_celery_until_max_attempts_in_the_database() -> None:
    # Eager apply runs Celery's retries inline. Autoretry wants to retry forever
    # (max_retries=None); the database says PENDING twice, then FAILED on the third attempt,
    # where the exception is raised instead of another retry.
    result = always_fails.apply(("eager-poison",))
    assert result.state == "FAILURE" and "attempt failed" in str(result.result)
    task = Task.objects.get(key="eager-poison")
    assert (task.status, task.attempts) == ("failed", 3)
    outcomes = list(Attempt.objects.filter(task=task).values_list("outcome", flat=True))
    assert outcomes == ["retry", "retry", "failed"]
    with pytest.raises(TaskFailed):
        always_fails("eager-poison")
    assert Effect.objects.filter(task_key="eager-poison").count() == 3


def test_direct_call_failure_is_final() -> None:
    with pytest.raises(Exception, match="attempt failed"):
        always_fails("direct-poison")
    assert Task.objects.get(key="direct-poison").status == "failed"


def test_enqueue_once_refuses_other_tasks_and_wrong_keys() -> None:
    with pytest.raises(TypeError, match="needs a task made by claimed_task"):
        enqueue_once(app.tasks["celery.backend_cleanup"], key="k")
    with pytest.raises(InvalidTaskKey, match="computes key 'work-a'"):
        enqueue_once(work, key="work-b", args=("a",))
    assert not Task.objects.exists()


def test_a_queued_task_under_the_key_is_refused_by_the_body_and_by_enqueue_once() -> None:
    Task.objects.ensure("self-q", queue="default")  # queued work (a Django task, a handler's)
    with pytest.raises(InvalidTaskKey, match="already names other work"):
        completes_itself("q")
    with pytest.raises(InvalidTaskKey, match="already names other work"), transaction.atomic():
        enqueue_once(completes_itself, key="self-q", args=("q",))
    task = Task.objects.get(key="self-q")
    assert (task.status, task.attempts, task.dispatch) == (Task.Status.PENDING, 0, None)
    assert not Effect.objects.exists()


def test_enqueue_once_records_what_to_send_again() -> None:
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        handle = enqueue_once(work, key="work-d", args=("d",), kwargs={"seconds": 0}, queue="q1", priority=3,
                              countdown=60)
        task = Task.objects.get(key="work-d")
        # Not published yet (no broker is reachable here, so `sent` alone proves nothing):
        # the publish waits among the transaction's on-commit callbacks.
        assert handle.created and not handle.sent and handle.error is None and task.max_attempts == 5
        assert len(transaction.get_connection().run_on_commit) == 1
        assert task.dispatch["task"] == "tests.programs.celery_app.work"
        assert task.dispatch["task_id"] == handle.celery_id
        assert task.dispatch["args"] == ["d"] and task.dispatch["kwargs"] == {"seconds": 0}
        assert task.dispatch["options"] == {"queue": "q1", "priority": 3}  # countdown is not replayed
        assert task.dispatch["eta"]  # but it delays the requeue sweep
        raise Abort
    assert not handle.sent and not Task.objects.exists()


def test_requeue_after_needs_requeue() -> None:
    with pytest.raises(CommandError, match="--requeue-after needs --requeue"):
        call_command("taskclaim_reclaim", "--requeue-after", "5")


def test_enqueued_names_the_message_celery_id_only() -> None:
    """``task_id`` names a row's primary key elsewhere (``Claim.task_id``): ``Enqueued`` has no such name."""
    with transaction.atomic():
        handle = enqueue_once(work, key="work-e", args=("e",), task_id="msg-e")
        assert handle.celery_id == "msg-e" == Task.objects.get(key="work-e").dispatch["task_id"]
        assert not hasattr(handle, "task_id")
        transaction.set_rollback(True)  # publish nothing: no broker here


def test_requeued_names_the_row_and_the_message_apart() -> None:
    task = ensure("work-f", dispatch={"task": "tests.programs.celery_app.work", "task_id": "msg-f", "args": ["f"]})
    Task.objects.filter(pk=task.pk).update(updated_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))  # its message is lost
    [found] = requeue_lost(older_than=60, dry_run=True)
    assert (found.task_pk, found.celery_id, found.key) == (task.pk, "msg-f", "work-f")


def test_requeue_lost_records_each_resend_and_a_second_sweep_sends_nothing() -> None:
    """Each re-send is recorded (send count, ``updated_at`` from the database clock) by the guarded
    ``requeue`` transition before its message goes out; the next sweep finds nothing lost."""
    from django_taskclaim.claims import reclaim_expired_rows

    # kombu's in-process transport; not made Celery's current app, which shared tasks (and the
    # bridge, without app=) resolve to for the rest of the process.
    memory = celery.Celery("requeue-test", broker="memory://", set_as_current=False)
    dispatch = {"task": "tests.programs.celery_app.work", "args": ["g"], "kwargs": {}, "sent": 1}
    lost = ensure("work-g", dispatch={**dispatch, "task_id": "msg-g"})
    Task.objects.filter(pk=lost.pk).update(updated_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    ensure("work-h", dispatch={**dispatch, "task_id": "msg-h"})
    held = Task.objects.claim("work-h", owner="gone", lease=600).claim
    assert held is not None
    expire(held)
    sent = requeue_lost(reclaim_expired_rows(), older_than=60, app=memory)
    assert sorted((r.key, r.celery_id, r.error) for r in sent) == [("work-g", "msg-g", None), ("work-h", "msg-h", None)]
    for task in Task.objects.filter(key__in=["work-g", "work-h"]):
        assert task.status == "pending" and task.dispatch["sent"] == 2
        assert task.updated_at > dt.datetime(2001, 1, 1, tzinfo=dt.UTC)
    with memory.connection_for_read() as conn:
        queue = conn.SimpleQueue("celery")
        ids = sorted(queue.get(timeout=5).headers["id"] for _ in range(2))
        queue.close()
    assert ids == ["msg-g", "msg-h"]
    assert requeue_lost(older_than=60, app=memory) == []  # just re-sent: not lost


def test_the_requeue_transition_is_guarded() -> None:
    """``Task.requeue`` (the public transition the bridge uses) records a re-send only of a task still
    pending with the reclaimed token, or unchanged for ``older_than`` seconds by the database clock:
    a task claimed meanwhile is never sent."""
    pending = ensure("work-i", dispatch={"task": "tests.programs.celery_app.work", "task_id": "msg-i"})
    again = {"sent": 2, "task": "tests.programs.celery_app.work", "task_id": "msg-i"}
    assert not pending.requeue(again, older_than=60)  # fresh
    assert not Task.objects.filter(pk=pending.pk).idle_for(60).exists()
    Task.objects.filter(pk=pending.pk).update(updated_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    assert Task.objects.filter(pk=pending.pk).idle_for(60).exists()
    assert not pending.requeue(again, token=1)  # never claimed: token 0
    assert pending.requeue(again, older_than=60)
    assert Task.objects.get(pk=pending.pk).dispatch["sent"] == 2
    Task.objects.filter(pk=pending.pk).update(updated_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    assert Task.objects.claim("work-i", owner="w").claimed  # claimed between the sweep's read and write
    assert not pending.requeue(again, older_than=0)
    assert not pending.requeue(again, token=1)
    assert Task.objects.get(pk=pending.pk).dispatch["sent"] == 2


#: Every public name ``django_taskclaim.celery`` had while it was one module (before the split).
BEFORE_THE_SPLIT = {
    "AMQP_SCHEMES", "CONSUMER_TIMEOUT_DEFAULT", "ON_BUSY", "REQUEUE_AFTER", "VISIBILITY_TIMEOUT_DEFAULTS",
    "ClaimOptions", "ClaimedTask", "Enqueued", "KeySpec", "Requeued", "broker_scheme", "busy_countdown",
    "celery_app", "claimed_task", "claimed_tasks", "consumer_timeout", "enqueue_once", "import_task_modules",
    "in_use", "project_app", "queue_arguments", "requeue_lost", "visibility_timeout",
}


def test_the_public_import_path_keeps_every_name() -> None:
    from django_taskclaim import celery as bridge

    assert set(bridge.__all__) == BEFORE_THE_SPLIT
    missing = [name for name in bridge.__all__ if not hasattr(bridge, name)]
    assert not missing
