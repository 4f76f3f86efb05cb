"""The execution protocol (``django_taskclaim.execution``; its rules in lifecycle/execution.py):
one rule for how a body's end ends its claim, whoever runs the body (run_once, the queue worker,
the Celery bridge, LangGraph nodes)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from django.db import connection, transaction

from django_taskclaim import run_once
from django_taskclaim.exceptions import StaleClaim, TaskClaimError
from django_taskclaim.execution import (
    FENCED_OFF,
    EndingRolledBack,
    Policy,
    current_claim,
    execute,
)
from django_taskclaim.models import Attempt, Task
from django_taskclaim.signals import task_claimed
from django_taskclaim.worker import work
from tests.conftest import expire
from tests.sessions import kill_session_of
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def fenced_effect_then_rollback(claim, *, roll_back: bool) -> str:  # type: ignore[no-untyped-def]
    """Publish and complete in one fenced() block inside the body's own transaction, which the
    body then rolls back (or not): the completion goes with it."""
    with transaction.atomic():
        with claim.fenced():
            Effect.objects.create(task_key=claim.key, token=claim.token, worker="w")
            claim.complete({"published": claim.key})
        if roll_back:
            transaction.set_rollback(True)
    return "returned"


def test_a_completion_rolled_back_by_the_handler_is_counted_by_what_committed() -> None:
    """Issue 25.4: a handler that completes inside a transaction it then rolls back was counted
    succeeded while the task stayed RUNNING (and ran again after its lease). The worker counts
    what committed: a failure (retried at once), then the run that did publish."""
    Task.objects.ensure("job", queue="default")
    ran: Counter[int] = Counter()

    def handler(claim):  # type: ignore[no-untyped-def]
        ran[claim.attempt] += 1
        return fenced_effect_then_rollback(claim, roll_back=claim.attempt == 1)

    stats = work(handler, owner="w", until_drained=True)
    assert (stats.succeeded, stats.failed, stats.fenced_off, stats.retried) == (1, 0, 0, 1)
    assert ran == Counter({1: 1, 2: 1})
    task = Task.objects.get(key="job")
    assert (task.status, task.result, task.attempts) == ("succeeded", {"published": "job"}, 2)
    assert Effect.objects.count() == 1
    first, second = Attempt.objects.filter(task=task).order_by("token")
    assert (first.outcome, second.outcome) == ("retry", "succeeded")


def test_run_once_reports_a_completion_its_body_rolled_back() -> None:
    with pytest.raises(EndingRolledBack, match="rolled back"):
        run_once("job", lambda: fenced_effect_then_rollback(current_claim(), roll_back=True))
    task = Task.objects.get(key="job")
    assert task.status == "pending" and "rolled back" in task.error
    assert Effect.objects.count() == 0
    # The body completed its claim itself: the caller gets what it stored, as every duplicate does.
    assert run_once("job", lambda: fenced_effect_then_rollback(current_claim(), roll_back=False)) == {
        "published": "job"}
    assert Task.objects.get(key="job").result == {"published": "job"} and Effect.objects.count() == 1


def test_a_completion_inside_an_outer_transaction_that_commits_counts_once() -> None:
    """Inside the caller's still-open transaction the body's ending counts (it commits with it)."""
    Task.objects.ensure("job", queue="default")
    with transaction.atomic():
        [claim] = Task.objects.claim_next(owner="w")
        executed = execute(claim, fenced_effect_then_rollback, (claim,), {"roll_back": False})
    assert (executed.ending, executed.by_body, executed.error) == ("succeeded", True, None)
    assert Task.objects.get(key="job").status == "succeeded"


def test_the_body_that_ended_its_claim_and_then_raised_is_not_ended_twice() -> None:
    claim = Task.objects.claim("job").claim

    def body() -> None:
        claim.fail("gave up", retry=False)
        raise RuntimeError("and then raised")

    executed = execute(claim, body)
    assert (executed.ending, executed.by_body, str(executed.error)) == ("failed", True, "and then raised")
    assert Task.objects.get(key="job").error == "gave up"


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit, LookupError])
def test_a_shutdown_gives_the_claim_back_and_a_give_back_exception_too(raised: type[BaseException]) -> None:
    claim = Task.objects.claim("job").claim

    def body() -> None:
        raise raised()

    executed = execute(claim, body, policy=Policy(release_on=(LookupError,)))
    assert executed.ending == "pending" and isinstance(executed.error, raised)
    task = Task.objects.get(key="job")
    assert (task.status, task.attempts) == ("pending", 0)  # released: the attempt does not count


def test_a_fenced_off_body_writes_nothing_and_keeps_its_own_error() -> None:
    claim = Task.objects.claim("job", lease=5).claim

    def body() -> None:
        expire(claim)
        assert Task.objects.claim("job", owner="thief").claimed
        raise ValueError("mine")

    executed = execute(claim, body)
    assert executed.ending == FENCED_OFF and isinstance(executed.error, ValueError)
    assert Task.objects.get(key="job").owner == "thief"


def test_current_claim_is_the_running_bodys_and_only_there() -> None:
    with pytest.raises(TaskClaimError, match="only available inside"):
        current_claim()
    claim = Task.objects.claim("job").claim
    assert execute(claim, lambda: current_claim() is claim).value is True
    with pytest.raises(TaskClaimError):
        current_claim()


def test_batched_claims_age_from_the_claim_not_from_when_slow_receivers_returned() -> None:
    """Issue 25.1: with a ``task_claimed`` receiver taking 0.7 s per claim (batch 3, lease 1.5 s),
    the worker stamped the batch's claim time after the receivers ran: claims that had already
    expired looked fresh and ran without the renewal check. Here the third receiver call lets
    another worker take the first (expired) task over; it must not run here as well."""
    for key in ("a", "b", "c"):
        Task.objects.ensure(key, queue="default")
    calls = threading.local()
    seen: list[str] = []

    def slow_receiver(claim, **kwargs):  # type: ignore[no-untyped-def]
        if getattr(calls, "inside", False) or claim.owner != "w":
            return
        seen.append(claim.key)
        time.sleep(0.7)  # a slow receiver is the point of this test, not a synchronisation
        if len(seen) == 3:  # the first claim's 1.5 s lease has run out by now: a takeover
            calls.inside = True
            try:  # the expired task first, of the lowest id: "a"
                assert [c.key for c in Task.objects.claim_next(owner="thief", lease=30)] == ["a"]
            finally:
                calls.inside = False

    ran: list[str] = []
    task_claimed.connect(slow_receiver, dispatch_uid="slow")
    try:
        stats = work(lambda claim: ran.append(claim.key), owner="w", batch=3, lease=1.5, max_tasks=3)
    finally:
        task_claimed.disconnect(dispatch_uid="slow")
    assert "a" not in ran and sorted(ran) == ["b", "c"]
    assert (stats.succeeded, stats.fenced_off) == (2, 1)
    assert Task.objects.get(key="a").owner == "thief"


@pytest.mark.parametrize("after", ["queries", "returns"])
def test_a_worker_survives_its_session_killed_during_a_handler(after: str) -> None:
    """Issue 25.5: a worker whose session is killed (pg_terminate_backend, KILL CONNECTION) during a
    handler died, and the task ran again after the lease. It reconnects and ends the claim by the
    rules: a handler that failed on the dead session is recorded as a failure (and retried at
    once), one that returned is completed."""
    if connection.vendor == "sqlite":
        pytest.skip("terminating a session needs a database server (PostgreSQL, MariaDB)")
    Task.objects.ensure("job", queue="default")
    ran: Counter[int] = Counter()

    def handler(claim):  # type: ignore[no-untyped-def]
        ran[claim.attempt] += 1
        if claim.attempt == 1:
            kill_session_of(connection)
            if after == "queries":
                Effect.objects.count()  # the dead session: the handler raises
        return {"attempt": claim.attempt}

    stats = work(handler, owner="w", until_drained=True)
    task = Task.objects.get(key="job")
    assert task.status == "succeeded"
    if after == "queries":
        assert (stats.succeeded, stats.failed, stats.retried) == (1, 0, 1) and ran == Counter({1: 1, 2: 1})
        assert task.result == {"attempt": 2}
    else:
        assert (stats.succeeded, stats.failed) == (1, 0) and ran == Counter({1: 1})
        assert task.result == {"attempt": 1}


def test_a_claim_whose_session_dropped_before_its_completion_completes_once() -> None:
    if connection.vendor == "sqlite":
        pytest.skip("terminating a session needs a database server (PostgreSQL, MariaDB)")
    claim = Task.objects.claim("job").claim
    kill_session_of(connection)
    claim.complete("done")
    assert Task.objects.values_list("status", "result").get() == ("succeeded", "done")
    assert Attempt.objects.get().outcome == "succeeded"


def test_a_stale_claim_raised_by_the_body_itself_is_fenced_off() -> None:
    claim = Task.objects.claim("job").claim

    def body() -> None:
        raise StaleClaim("job", "", claim.token, "check")

    assert execute(claim, body).ending == FENCED_OFF
    assert Task.objects.get(key="job").status == "running"  # nothing written by a fenced-off claim


def test_the_public_door_hands_on_the_protocol_itself() -> None:
    """``django_taskclaim.execution`` is what the plug-ins use: the protocol's own objects, not copies."""
    from django_taskclaim import execution
    from django_taskclaim.lifecycle import execution as rules

    for name in execution.__all__:
        if name != "error_text":
            assert getattr(execution, name) is getattr(rules, name), name
    assert execution.error_text(ValueError("bad")) == "ValueError: bad"


def test_a_claims_log_fields_are_public() -> None:
    """``claim.log_extra()``: the structured fields a plug-in's log lines carry (no private method)."""
    claim = Task.objects.claim("logged", tenant="t", owner="w").claim
    assert claim is not None
    fields = claim.log_extra()
    assert {k: fields[k] for k in ("key", "tenant", "token", "owner")} == {
        "key": "logged", "tenant": "t", "token": claim.token, "owner": "w"}
    assert not hasattr(claim, "_log_extra")
