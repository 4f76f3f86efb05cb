"""The claim lifecycle: ownership, fencing, results, retries, bad input (one process)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_taskclaim import TaskKey, run_once
from django_taskclaim.exceptions import (
    InvalidLease,
    InvalidPayload,
    InvalidResult,
    InvalidTaskKey,
    PayloadMismatch,
    StaleClaim,
    TaskBusy,
    TaskFailed,
)
from django_taskclaim.models import Attempt, Task
from tests.conftest import expire, lease_left
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db


def claim_of(key: str, **kwargs):  # type: ignore[no-untyped-def]
    outcome = Task.objects.claim(key, **kwargs)
    assert outcome.claimed, f"expected to claim {key}, found {outcome.task.status}"
    return outcome.claim


def test_first_claim_creates_the_task_running_with_token_1() -> None:
    outcome = Task.objects.claim("job-1", owner="w1", lease=30)
    assert outcome.claimed
    claim, task = outcome.claim, outcome.task
    assert (claim.token, claim.owner, claim.key, claim.tenant) == (1, "w1", "job-1", "")
    assert (task.status, task.fencing_token, task.attempts, task.owner) == ("running", 1, 1, "w1")
    # The lease is live by the database clock.
    assert Task.objects.live().filter(pk=task.pk).exists()
    assert list(Attempt.objects.values_list("token", "owner", "outcome")) == [(1, "w1", "running")]


def test_a_live_claim_is_not_claimed_again() -> None:
    first = claim_of("job", owner="w1")
    second = Task.objects.claim("job", owner="w2")
    assert not second.claimed and second.claim is None
    assert (second.task.status, second.task.owner, second.task.fencing_token) == ("running", "w1", 1)
    assert Attempt.objects.filter(outcome="duplicate", owner="w2").count() == 1
    first.complete("done")


def test_expired_lease_is_taken_over_with_a_larger_token() -> None:
    first = claim_of("job", owner="w1")
    expire(first)
    second = claim_of("job", owner="w2")
    assert second.token == 2 > first.token
    task = Task.objects.get(key="job")
    assert (task.owner, task.fencing_token, task.attempts) == ("w2", 2, 2)
    outcomes = dict(Attempt.objects.values_list("token", "outcome"))
    assert outcomes == {1: "taken_over", 2: "running"}


@pytest.mark.parametrize("action", ["heartbeat", "complete", "fail", "release", "check"])
def test_a_stale_owner_is_refused_and_writes_nothing(action: str) -> None:
    stale = claim_of("job", owner="old")
    expire(stale)
    fresh = claim_of("job", owner="new")
    before = Task.objects.values().get(key="job")
    call = {
        "heartbeat": lambda: stale.heartbeat(),
        "complete": lambda: stale.complete({"from": "old"}),
        "fail": lambda: stale.fail("boom", retry=False),
        "release": lambda: stale.release(),
        "check": lambda: stale.check(),
    }[action]
    with pytest.raises(StaleClaim) as info:
        call()
    assert info.value.token == 1 and info.value.key == "job"
    assert Task.objects.values().get(key="job") == before
    assert Attempt.objects.get(token=1).stale_writes == 1
    fresh.complete({"from": "new"})
    assert Task.objects.get(key="job").result == {"from": "new"}


def test_fenced_writes_of_a_stale_owner_do_not_commit() -> None:
    stale = claim_of("job", owner="old")
    expire(stale)
    claim_of("job", owner="new")
    ran = []
    with pytest.raises(StaleClaim), stale.fenced():
        ran.append(True)
        Effect.objects.create(task_key="job", token=stale.token, worker="old")
    assert ran == [] and Effect.objects.count() == 0
    assert Attempt.objects.get(token=1).stale_writes == 1


def test_fenced_commits_effect_and_completion_together() -> None:
    claim = claim_of("job")
    with claim.fenced():
        Effect.objects.create(task_key="job", token=claim.token, worker="w")
        claim.complete({"n": 1}, result_ref="s3://bucket/job")
    task = Task.objects.get(key="job")
    assert (task.status, task.result, task.result_ref) == ("succeeded", {"n": 1}, "s3://bucket/job")
    assert Effect.objects.count() == 1
    assert Attempt.objects.get(token=1).outcome == "succeeded"


def test_an_error_inside_fenced_rolls_back_effect_and_completion() -> None:
    claim = claim_of("job")
    with pytest.raises(RuntimeError), claim.fenced():
        Effect.objects.create(task_key="job", token=claim.token, worker="w")
        claim.complete({"n": 1})
        raise RuntimeError("crash before commit")
    assert Effect.objects.count() == 0
    assert Task.objects.get(key="job").status == "running"
    claim.complete({"n": 2})  # the claim is still valid and can finish properly
    assert Task.objects.get(key="job").result == {"n": 2}


def test_heartbeat_extends_the_lease_even_after_expiry_until_someone_takes_over() -> None:
    claim = claim_of("job", lease=5)
    expire(claim)
    assert Task.objects.expired().filter(key="job").exists()
    new_expiry = claim.heartbeat(lease=60)
    assert claim.lease_expires_at == new_expiry
    assert Task.objects.live().filter(key="job").exists()
    assert Task.objects.get(key="job").lease_expires_at == new_expiry


def test_duplicate_delivery_after_success_returns_the_stored_result_and_runs_nothing() -> None:
    calls = []

    def work(x: int) -> dict[str, int]:
        calls.append(x)
        return {"double": 2 * x}

    assert run_once("job", work, 21) == {"double": 42}
    assert run_once("job", work, 21) == {"double": 42}
    assert calls == [21]
    again = Task.objects.claim("job")
    assert not again.claimed and again.task.result == {"double": 42}
    assert Attempt.objects.filter(outcome="duplicate").count() == 2


def test_run_once_on_busy_raise() -> None:
    claim_of("job", owner="other")
    with pytest.raises(TaskBusy, match="running under owner 'other'"):
        run_once("job", lambda: pytest.fail("must not run"))


def test_run_once_records_failure_for_retry_and_reraises() -> None:
    def boom() -> None:
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        run_once("job", boom)
    task = Task.objects.get(key="job")
    assert (task.status, task.error) == ("pending", "ValueError: bad input")
    assert run_once("job", lambda: "fixed") == "fixed"
    assert Task.objects.get(key="job").attempts == 2


def test_payload_mismatch_is_refused_and_changes_nothing() -> None:
    claim = claim_of("job", payload={"endpoint": "POST /payments"})
    before = Task.objects.values().get(key="job")
    with pytest.raises(PayloadMismatch, match="different payload"):
        Task.objects.claim("job", payload={"endpoint": "POST /refunds"})
    with pytest.raises(PayloadMismatch):
        Task.objects.ensure("job", payload={"endpoint": "POST /refunds"})
    assert Task.objects.values().get(key="job") == before
    # The same payload (in any key order) is a duplicate delivery, not a mismatch.
    assert not Task.objects.claim("job", payload={"endpoint": "POST /payments"}).claimed
    claim.complete()


def test_payload_is_stored_on_first_sight() -> None:
    Task.objects.ensure("job")
    claim = claim_of("job", payload={"v": 1})
    assert Task.objects.get(key="job").payload == {"v": 1}
    claim.release()
    with pytest.raises(PayloadMismatch):
        Task.objects.claim("job", payload={"v": 2})


def test_tenants_are_isolated() -> None:
    a = claim_of("job", tenant="acme")
    b = claim_of("job", tenant="globex")
    assert a.task_id != b.task_id and a.token == b.token == 1
    a.complete("acme result")
    assert Task.objects.get(tenant="globex", key="job").status == "running"
    assert Task.objects.claim("job", tenant="acme").task.result == "acme result"
    assert Task.objects.claim("job").claimed  # the default tenant "" is a third task
    assert Task.objects.count() == 3


def test_taskkey_carries_its_tenant() -> None:
    key = TaskKey("test-generation", run="run-42", scope=("payments",), tenant="acme")
    claim = claim_of(key)  # type: ignore[arg-type]
    assert (claim.key, claim.tenant) == ("run-42:payments:test-generation", "acme")
    with pytest.raises(InvalidTaskKey, match="contradicts"):
        Task.objects.claim(key, tenant="globex")


def test_retry_until_max_attempts_then_failed() -> None:
    for attempt in range(1, 4):
        claim = claim_of("job", max_attempts=3)
        assert claim.attempt == attempt
        status = claim.fail(RuntimeError(f"try {attempt}"), retry=True)
        assert status == ("pending" if attempt < 3 else "failed")
    task = Task.objects.get(key="job")
    assert (task.status, task.attempts, task.error) == ("failed", 3, "RuntimeError: try 3")
    assert list(Attempt.objects.order_by("token").values_list("outcome", flat=True)) == ["retry", "retry", "failed"]
    outcome = Task.objects.claim("job")
    assert not outcome.claimed and outcome.task.status == "failed"
    with pytest.raises(TaskFailed, match="try 3"):
        run_once("job", lambda: None)


def test_final_failure_without_retry() -> None:
    claim = claim_of("job")
    assert claim.fail("no way", retry=False) == "failed"
    assert Task.objects.get(key="job").status == "failed"


def test_an_expired_last_attempt_ends_failed_instead_of_being_taken_over() -> None:
    claim = claim_of("job", max_attempts=1)
    expire(claim)
    outcome = Task.objects.claim("job")
    assert not outcome.claimed
    assert (outcome.task.status, outcome.task.error) == ("failed", "lease expired with no attempts left")
    with pytest.raises(StaleClaim):
        claim.complete()


def test_release_gives_the_task_back_without_spending_an_attempt() -> None:
    first = claim_of("job", owner="w1")
    first.release()
    task = Task.objects.get(key="job")
    assert (task.status, task.owner, task.attempts, task.lease_expires_at) == ("pending", "", 0, None)
    second = claim_of("job", owner="w2")
    assert second.token == 2
    with pytest.raises(StaleClaim):
        first.complete()


def test_cancel_and_reset() -> None:
    claim = claim_of("job")
    assert Task.objects.filter(key="job").cancel() == 1
    with pytest.raises(StaleClaim):
        claim.heartbeat()
    outcome = Task.objects.claim("job")
    assert not outcome.claimed and outcome.task.status == "cancelled"
    with pytest.raises(TaskFailed, match="cancelled"):
        run_once("job", lambda: None)
    assert Task.objects.filter(key="job").reset() == 1
    again = claim_of("job")
    assert again.token == 2 and again.attempt == 1


def test_force_release_fences_off_the_current_owner() -> None:
    claim = claim_of("job")
    assert Task.objects.filter(key="job").force_release() == 1
    with pytest.raises(StaleClaim):
        claim.complete()
    assert Task.objects.get(key="job").status == "pending"
    assert Attempt.objects.get(token=1).outcome == "released"


@pytest.mark.parametrize(
    ("result", "error"),
    [({"at": object()}, "not JSON-serialisable"), (float("inf"), "not JSON-serialisable"),
     ("x" * 2000, "bytes of JSON; TASKCLAIM_MAX_RESULT_BYTES allows 1000")],
)
def test_a_refused_result_leaves_the_claim_running_and_completable(settings, result, error) -> None:  # type: ignore[no-untyped-def]
    settings.TASKCLAIM_MAX_RESULT_BYTES = 1000
    claim = claim_of("job")
    with pytest.raises(InvalidResult, match=error):
        claim.complete(result)
    assert Task.objects.get(key="job").status == "running"
    claim.complete({"ok": True})
    assert Task.objects.get(key="job").result == {"ok": True}


def test_result_ref_is_validated() -> None:
    claim = claim_of("job")
    with pytest.raises(InvalidResult, match="result_ref"):
        claim.complete(result_ref=42)  # type: ignore[arg-type]
    with pytest.raises(InvalidResult, match="result_ref"):
        claim.complete(result_ref="x" * 2000)
    assert Task.objects.get(key="job").status == "running"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"key": 17}, InvalidTaskKey, "task key must be a string, not int"),
        ({"key": "a\x07b"}, InvalidTaskKey, "non-printable"),
        ({"key": "job", "tenant": None}, InvalidTaskKey, "tenant must be a string"),
        ({"key": "job", "lease": 0}, InvalidLease, "positive"),
        ({"key": "job", "lease": -3}, InvalidLease, "positive"),
        ({"key": "job", "payload": {"x": {1, 2}}}, InvalidPayload, "payload is not JSON-serialisable"),
        ({"key": "job", "max_attempts": 0}, ValueError, "max_attempts must be a positive integer"),
    ],
)
def test_bad_claim_input_is_named_and_stores_nothing(kwargs, error, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=message):
        Task.objects.claim(**kwargs)
    assert Task.objects.count() == 0 and Attempt.objects.count() == 0


def test_bad_input_never_changes_an_existing_task() -> None:
    claim = claim_of("job", payload={"a": 1})
    before = Task.objects.values().get(key="job")
    for bad in ({"lease": 0}, {"payload": {"a": object()}}, {"tenant": 5}):
        with pytest.raises(ValueError):
            Task.objects.claim("job", **bad)
    with pytest.raises(InvalidLease):
        claim.heartbeat(lease=-1)
    assert Task.objects.values().get(key="job") == before


def test_ensure_creates_pending_once() -> None:
    task = Task.objects.ensure("job", payload={"a": 1}, max_attempts=7)
    assert (task.status, task.max_attempts, task.payload, task.fencing_token) == ("pending", 7, {"a": 1}, 0)
    again = Task.objects.ensure("job", payload={"a": 1})
    assert again.pk == task.pk and Task.objects.count() == 1


def test_claims_use_the_database_clock(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The lease runs 30 s from the database clock, whatever this process's clock says.

    Python's clock is moved an hour ahead, so a lease computed from it would be ~3630 s away by
    the database clock. Expiry and the database's now are read in one statement and subtracted
    exactly (no float ``julianday`` arithmetic), so the upper bound holds to the microsecond.
    """
    from django.utils import timezone

    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(hours=1))
    claim = claim_of("job", lease=30)
    remaining = lease_left("job")
    assert 25 < remaining <= 30
    # By the (skewed) process clock the same lease looks an hour over: the clocks are told apart.
    assert (claim.lease_expires_at - timezone.now()).total_seconds() < -3500
    claim.release()
