"""Timeouts that fence (issue 32, item 3): past its timeout an attempt's claim is fenced off at once,
the attempt recorded with ``TimedOut`` and the task retried or failed by its policy; an async body
is cancelled, a sync one runs on harmlessly (nothing it writes in ``fenced()`` commits) and keeps its
slot until it returns; the worker goes on."""

from __future__ import annotations

import asyncio
import io
import logging
import threading
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from devtools.polling import wait_until
from django_taskclaim.exceptions import InvalidArgument, StaleClaim
from django_taskclaim.lifecycle import deadlines
from django_taskclaim.models import Attempt, Task
from django_taskclaim.tasks import claim_options
from django_taskclaim.tasks.runner import TaskRunner
from django_taskclaim.worker import work
from tests.testapp import timeout_tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

TIMED_OUT = "django_taskclaim.exceptions.TimedOut"


def fenced_off(claim: Any) -> bool:
    """Whether the task of ``claim`` (or a ``Task``) is no longer RUNNING under its claim."""
    pk = getattr(claim, "task_id", getattr(claim, "pk", None))
    return not Task.objects.filter(pk=pk, status=Task.Status.RUNNING).exists()


def late_write(claim: Any) -> str:
    """Write an effect in ``fenced()`` after the claim was fenced off: what that met."""
    try:
        with claim.fenced():
            Effect.objects.create(task_key=claim.key, token=claim.token, worker="late")
    except StaleClaim:
        return "refused"
    return "committed"


def test_a_body_past_its_timeout_commits_nothing_even_before_the_watcher_fenced_it_off() -> None:
    """A paused or starved worker wakes with its deadline passed and the watcher thread not yet
    run: the body's fenced write is refused by the clock all the same (the claim still RUNNING),
    and the task ends FAILED with TimedOut, not with the late body's result."""
    Task.objects.ensure("starved", queue="default", max_attempts=1)
    met: dict[str, Any] = {}
    watcher = deadlines._watcher()

    def handler(claim):  # type: ignore[no-untyped-def]
        with watcher.cond:  # the watcher thread cannot take a deadline off its queue meanwhile
            time.sleep(0.4)  # the body's work, past its timeout
            met["running"] = not fenced_off(claim)
            met["write"] = late_write(claim)
        return "late"

    work(handler, owner="starved", timeout=0.2, until_drained=True, poll=0.05)
    assert met == {"running": True, "write": "refused"}
    assert not Effect.objects.exists()
    task = Task.objects.get(key="starved")
    assert (task.status, task.result) == (Task.Status.FAILED, None)
    assert task.error.startswith("TimedOut: the attempt ran past its timeout of 0.2 s")


def test_a_body_inside_fenced_when_its_timeout_passes_commits_nothing() -> None:
    """Issue 40, item 21: a body that entered ``fenced()`` in time, and is still inside it when its
    timeout passes, commits nothing: the block checks the deadline again before its COMMIT (the
    watcher, held back here, would fence the claim off only after that COMMIT, its write waiting
    for the row the block locked)."""
    Task.objects.ensure("inside", queue="default", max_attempts=1)
    met: dict[str, Any] = {}
    watcher = deadlines._watcher()

    def handler(claim):  # type: ignore[no-untyped-def]
        try:
            with claim.fenced():
                Effect.objects.create(task_key=claim.key, token=claim.token, worker="inside")
                with watcher.cond:  # the watcher thread cannot take the deadline off its queue meanwhile
                    wait_until(claim.overran, timeout=20, interval=0.01, what="the timeout to pass")
                    met["running"] = not fenced_off(claim)
        except StaleClaim:
            met["write"] = "refused"
        return "late"

    stats = work(handler, owner="inside", timeout=0.2, until_drained=True, poll=0.05)
    assert met == {"running": True, "write": "refused"}
    assert not Effect.objects.exists()
    task = Task.objects.get(key="inside")
    assert (task.status, task.result) == (Task.Status.FAILED, None)
    assert task.error.startswith("TimedOut: the attempt ran past its timeout of 0.2 s")
    assert stats.timed_out == 1


def test_a_completion_after_the_timeout_is_refused_and_changes_nothing() -> None:
    claim = Task.objects.claim("overran", lease=30).claim
    claim.timeout_at = time.monotonic()  # as deadlines.watch() sets it: passed now
    with pytest.raises(StaleClaim):
        claim.complete("late")
    with pytest.raises(StaleClaim):
        claim.complete_and_claim_next("late")
    task = Task.objects.get(key="overran")
    assert (task.status, task.fencing_token, task.result) == (Task.Status.RUNNING, claim.token, None)


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_sync_handler_past_its_timeout_is_fenced_off_at_once_and_cannot_commit(concurrency: int) -> None:
    Task.objects.ensure("slow", queue="default", priority=10, max_attempts=1)
    Task.objects.ensure("quick", queue="default")
    met: dict[str, Any] = {}

    def handler(claim):  # type: ignore[no-untyped-def]
        if claim.key == "slow":
            started = time.monotonic()
            wait_until(lambda: fenced_off(claim), timeout=20, interval=0.02, what="the timeout's fencing")
            met["after"] = time.monotonic() - started  # fenced off while the body still runs
            met["write"] = late_write(claim)
        return claim.key

    stats = work(handler, owner="timer", timeout=0.3, concurrency=concurrency, until_drained=True, poll=0.05)
    assert met["write"] == "refused" and 0.25 < met["after"] < 5
    assert not Effect.objects.exists()
    slow = Task.objects.get(key="slow")
    assert (slow.status, slow.attempts) == (Task.Status.FAILED, 1)
    assert slow.error.startswith("TimedOut: the attempt ran past its timeout of 0.3 s")
    assert Attempt.objects.get(task=slow).error_class == TIMED_OUT
    assert Task.objects.get(key="quick").status == Task.Status.SUCCEEDED  # the worker went on
    assert (stats.timed_out, stats.succeeded) == (1, 1)


def test_a_timed_out_task_is_retried_by_its_policy() -> None:
    Task.objects.ensure("again", queue="default", max_attempts=2)
    attempts: list[int] = []

    def handler(claim):  # type: ignore[no-untyped-def]
        attempts.append(claim.attempt)
        if claim.attempt == 1:
            wait_until(lambda: fenced_off(claim), timeout=20, interval=0.02, what="the timeout's fencing")
        return claim.attempt

    with override_settings(TASKCLAIM_RETRY_BACKOFF={"base": 0.01, "jitter": 0}):
        stats = work(handler, owner="timer", timeout=0.3, concurrency=2, until_drained=True, poll=0.02)
    task = Task.objects.get(key="again")
    assert (task.status, task.attempts, task.result, attempts) == (Task.Status.SUCCEEDED, 2, 2, [1, 2])
    assert list(Attempt.objects.filter(task=task).order_by("token").values_list("outcome", "error_class")) == [
        ("retry", TIMED_OUT), ("succeeded", "")]
    assert (stats.timed_out, stats.succeeded) == (1, 1)


def test_an_async_handler_past_its_timeout_is_cancelled_and_commits_nothing() -> None:
    Task.objects.ensure("sleeper", queue="default", max_attempts=1)
    met: dict[str, str] = {}

    async def handler(claim):  # type: ignore[no-untyped-def]
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            met["write"] = await sync_to_async(late_write)(claim)  # refused: fenced off before the cancel
            raise
        return "woke"

    started = time.monotonic()
    stats = work(handler, owner="timer", timeout=0.3, concurrency=4, until_drained=True, poll=0.05)
    assert time.monotonic() - started < 10  # cancelled, not slept out
    assert met["write"] == "refused" and not Effect.objects.exists()
    task = Task.objects.get(key="sleeper")
    assert (task.status, Attempt.objects.get(task=task).error_class) == (Task.Status.FAILED, TIMED_OUT)
    assert stats.timed_out == 1


def test_a_sync_task_past_its_timeout_keeps_its_slot_until_it_returns() -> None:
    """Two slots, one held by a timed-out sync body that cannot be stopped: the other tasks run one
    at a time, before its timeout and after it, never two at once."""
    Task.objects.ensure("stuck", queue="default", priority=10, max_attempts=1)
    others = [f"other{i}" for i in range(8)]
    for key in others:
        Task.objects.ensure(key, queue="default")
    lock, running, most, done, past = threading.Lock(), [0], [0], threading.Event(), threading.Event()
    after: list[str] = []
    finished: list[str] = []

    def handler(claim):  # type: ignore[no-untyped-def]
        if claim.key == "stuck":
            wait_until(lambda: fenced_off(claim), timeout=20, interval=0.02, what="the stuck task to time out")
            past.set()
            done.wait(30)  # until the others ran: long past its timeout
            return "late"
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            if past.is_set():
                after.append(claim.key)
        time.sleep(0.15)  # the work itself (two at once would overlap here)
        with lock:
            running[0] -= 1
            finished.append(claim.key)
            if len(finished) == len(others):
                done.set()
        return claim.key

    stats = work(handler, owner="timer", timeout=0.5, concurrency=2, until_drained=True, poll=0.02)
    assert most[0] == 1 and len(after) >= 2  # some ran after the timeout: still one at a time
    assert (stats.timed_out, stats.succeeded) == (1, 8)
    assert Task.objects.get(key="stuck").status == Task.Status.FAILED


def test_django_tasks_time_out_by_claim_options_and_by_the_backends_timeout() -> None:
    timeout_tasks.LATE_WRITES.clear()
    backend = {"default": {"BACKEND": "django_taskclaim.tasks.ClaimBackend", "QUEUES": ["default"],
                           "OPTIONS": {"TIMEOUT": 0.3}}}
    with override_settings(TASKS=backend):
        results = [timeout_tasks.sleeps_async.enqueue(), timeout_tasks.sleeps_sync.enqueue()]
        started = time.monotonic()
        stats = work(TaskRunner("default"), owner="timer", concurrency=2, until_drained=True, poll=0.05)
        assert time.monotonic() - started < 10
        for result in results:
            result.refresh()
            assert result.status.name == "FAILED"
            assert result.errors[-1].exception_class_path == TIMED_OUT
    assert timeout_tasks.LATE_WRITES == {"sleeps_async": "refused", "sleeps_sync": "refused"}
    assert not Effect.objects.exists() and stats.timed_out == 2


def test_a_timed_out_tasks_failure_is_logged_naming_timed_out_and_the_task(caplog: Any) -> None:
    """Issue 40, item 15: the framework's log line of a task that ran past its timeout names the
    task and carries its ``TimedOut`` (before, a sync task's read ``NoneType: None``: it was sent
    outside any error, the late body's return taken for its outcome)."""
    backend = {"default": {"BACKEND": "django_taskclaim.tasks.ClaimBackend", "QUEUES": ["default"],
                           "OPTIONS": {"TIMEOUT": 0.3}}}
    with override_settings(TASKS=backend), caplog.at_level(logging.WARNING):
        timeout_tasks.sleeps_async.enqueue()
        timeout_tasks.sleeps_sync.enqueue()
        stats = work(TaskRunner("default"), owner="timer", concurrency=2, until_drained=True, poll=0.05)
    assert stats.timed_out == 2
    formatter = logging.Formatter("%(levelname)s %(message)s")
    logged = [formatter.format(record) for record in caplog.records]
    assert not [text for text in logged if "NoneType: None" in text], logged
    for name in ("sleeps_sync", "sleeps_async"):
        failed = [text for text in logged if text.startswith("ERROR") and f"timeout_tasks.{name} state=FAILED" in text]
        assert len(failed) == 1, logged
        assert "django_taskclaim.exceptions.TimedOut: the attempt ran past its timeout of 0.3 s" in failed[0]


@pytest.mark.parametrize("value", [0, -1, float("inf"), True, "5"])
def test_a_bad_timeout_is_refused_naming_it(value: Any) -> None:
    with pytest.raises(InvalidArgument, match="timeout"):
        work(lambda claim: None, timeout=value)
    with pytest.raises(InvalidArgument, match=r"claim_options\(timeout"):
        claim_options(timeout=value)
    backend = {"default": {"BACKEND": "django_taskclaim.tasks.ClaimBackend", "OPTIONS": {"TIMEOUT": value}}}
    with override_settings(TASKS=backend):
        errors = [m for m in checks.run_checks() if m.id == "django_taskclaim.E201"]
    assert errors and "OPTIONS['TIMEOUT']" in errors[0].msg


def test_the_command_takes_a_timeout_for_a_handler_only() -> None:
    with pytest.raises(CommandError, match="timeout"):
        call_command("taskclaim_worker", "tests.programs.worker_handlers.effect", "--timeout", "0")
    with pytest.raises(CommandError, match="--timeout is for a handler worker"):
        call_command("taskclaim_worker", "--timeout", "5", stdout=io.StringIO())


def test_a_timeout_does_not_start_the_next_task_of_a_busy_one_at_a_time_worker() -> None:
    """``batch=2``, one task at a time: the first task's ending would start the second in its commit.
    The timeout's ending must not: the worker is still busy with the body it cannot stop, so the
    second stays reserved, and a rival that takes it meanwhile pays no attempt for this worker."""
    Task.objects.ensure("b000", queue="default", priority=10, max_attempts=1)
    Task.objects.ensure("b001", queue="default")
    rival: list[Any] = []

    def handler(claim):  # type: ignore[no-untyped-def]
        if claim.key == "b000":
            wait_until(lambda: fenced_off(claim), timeout=20, interval=0.02, what="the timeout's fencing")
            rival.extend(wait_until(lambda: Task.objects.claim_next(owner="rival", lease=60), timeout=20,
                                    interval=0.05, what="a rival to take b001"))
        return claim.key

    stats = work(handler, owner="serial", lease=1, batch=2, max_tasks=2, timeout=0.3)
    assert [c.key for c in rival] == ["b001"] and rival[0].attempt == 1
    assert Task.objects.get(key="b001").attempts == 1
    assert (stats.timed_out, stats.fenced_off) == (1, 1)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_sync_task_stuck_past_its_timeout_and_the_hard_grace_gives_the_worker_up(concurrency: int) -> None:
    """``work(hard_timeout_grace=G, on_stuck=...)``: a sync body still running ``G`` s past its
    timeout makes the worker stop claiming; the task in flight beside it finishes, the claims it
    holds and did not start go back uncharged, then ``on_stuck()`` is called once (a supervisor's
    child exits there; here it lets the stuck body return, as that exit would end it)."""
    for key in ("stuck", "beside", "later-1", "later-2", "later-3"):
        Task.objects.ensure(key, queue="default", max_attempts=1)
    given_up = threading.Event()
    calls: list[float] = []
    ran: list[str] = []

    def handler(claim):  # type: ignore[no-untyped-def]
        ran.append(claim.key)
        if claim.key == "stuck":
            given_up.wait(60)  # heedless of its timeout: until the process would end
        else:
            time.sleep(0.3)  # the work
        return claim.key

    def on_stuck() -> None:
        calls.append(time.monotonic())
        given_up.set()

    started = time.monotonic()
    stats = work(handler, owner="w", timeout=0.5, hard_timeout_grace=0.5, on_stuck=on_stuck, batch=2,
                 concurrency=concurrency, poll=0.05)
    assert len(calls) == 1 and calls[0] - started >= 1.0  # the timeout, then the grace
    stuck = Task.objects.get(key="stuck")
    assert (stuck.status, stuck.attempts) == (Task.Status.FAILED, 1) and "TimedOut" in stuck.error
    assert ran.count("stuck") == 1 and stats.timed_out == 1
    tasks = {t.key: (t.status, t.attempts) for t in Task.objects.exclude(key="stuck")}
    ended = {k for k, (status, _) in tasks.items() if status == Task.Status.SUCCEEDED}
    assert ended == set(ran) - {"stuck"}  # what started, finished; nothing else ran
    assert all(v == (Task.Status.PENDING, 0) for k, v in tasks.items() if k not in ended), tasks  # uncharged
    if concurrency == 2:
        assert "beside" in ended


def test_hard_timeout_grace_goes_with_on_stuck() -> None:
    with pytest.raises(InvalidArgument, match="hard_timeout_grace and on_stuck go together"):
        work(lambda claim: None, hard_timeout_grace=1)
