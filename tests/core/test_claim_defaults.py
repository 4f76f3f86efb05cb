"""What a claim is given when the call leaves an option out, and when its lease is counted from.

``complete_and_claim_next()`` without ``queue=``, ``path=`` or ``lease=`` takes the completed
task's; a claim's lease is aged from before its statement was sent, never from the reply (issue
30, item 14: both could be broken without any test failing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import override_settings

from django_taskclaim.lifecycle import transitions
from django_taskclaim.models import Task

pytestmark = pytest.mark.django_db

ROUND_TRIP = 10.0  # seconds a slow statement takes, by the fake clock


class Clock:
    """A monotonic clock that moves only when told to (no sleep, no race with the machine's load)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The claim modules' clock, faked; ``slow(name)`` makes transition ``name`` take ``ROUND_TRIP``."""
    fake = Clock()
    monkeypatch.setattr("django_taskclaim.lifecycle.claim.time", fake)
    monkeypatch.setattr("django_taskclaim.lifecycle.api.time", fake)
    return fake


def slow(monkeypatch: pytest.MonkeyPatch, clock: Clock, name: str) -> None:
    """Transition ``name`` answers ``ROUND_TRIP`` seconds after it was sent."""
    real: Callable[..., Any] = getattr(transitions, name)

    def late(*args: Any, **kwargs: Any) -> Any:
        answer = real(*args, **kwargs)
        clock.now += ROUND_TRIP
        return answer

    monkeypatch.setattr(transitions, name, late)


# -- the lease is counted from the send ----------------------------------------------------------
def test_a_claim_by_key_counts_its_lease_from_before_the_statement_was_sent(monkeypatch, clock) -> None:  # type: ignore[no-untyped-def]
    slow(monkeypatch, clock, "claim_key")
    claim = Task.objects.claim("job", lease=30).claim
    assert claim is not None and claim.remaining() == 30 - ROUND_TRIP


def test_a_queue_claim_counts_its_lease_from_before_the_statement_was_sent(monkeypatch, clock) -> None:  # type: ignore[no-untyped-def]
    Task.objects.ensure("a", queue="default")
    Task.objects.ensure("b", queue="default")
    slow(monkeypatch, clock, "claim_next")
    claims = Task.objects.claim_next(lease=30, limit=2)
    assert [c.remaining() for c in claims] == [30 - ROUND_TRIP] * 2


def test_the_claims_a_completion_makes_count_their_lease_from_its_send(monkeypatch, clock) -> None:  # type: ignore[no-untyped-def]
    Task.objects.ensure("a", queue="default")
    Task.objects.ensure("b", queue="default")
    [first] = Task.objects.claim_next(lease=30)
    slow(monkeypatch, clock, "complete_and_claim_next")
    [second] = first.complete_and_claim_next("done")
    assert second.remaining() == 30 - ROUND_TRIP


def test_a_heartbeat_counts_the_new_lease_from_before_it_was_sent(monkeypatch, clock) -> None:  # type: ignore[no-untyped-def]
    claim = Task.objects.claim("job", lease=30).claim
    assert claim is not None and claim.remaining() == 30
    clock.now += 25
    slow(monkeypatch, clock, "heartbeat")
    claim.heartbeat(60)
    assert (claim.lease, claim.remaining()) == (60, 60 - ROUND_TRIP)


def test_what_is_left_goes_down_with_the_clock_and_below_zero(clock) -> None:  # type: ignore[no-untyped-def]
    claim = Task.objects.claim("job", lease=30).claim
    assert claim is not None
    clock.now += 12.5
    assert claim.remaining() == 17.5
    clock.now += 20
    assert claim.remaining() == -2.5


# -- what complete_and_claim_next takes when it is not told ----------------------------------------
def test_complete_and_claim_next_claims_from_the_completed_tasks_queue() -> None:
    Task.objects.ensure("default-1", queue="default")
    Task.objects.ensure("mail-1", queue="mail")
    Task.objects.ensure("mail-2", queue="mail")
    [mail] = Task.objects.claim_next(queue="mail")
    assert mail.key == "mail-1"
    assert [c.key for c in mail.complete_and_claim_next(limit=5)] == ["mail-2"]
    assert Task.objects.get(key="default-1").status == Task.Status.PENDING
    [other] = Task.objects.claim_next(queue="default")
    assert other.key == "default-1" and other.complete_and_claim_next() == []  # nothing left in 'default'


def test_complete_and_claim_next_given_queues_claims_from_them() -> None:
    Task.objects.ensure("mail-1", queue="mail")
    Task.objects.ensure("report-1", queue="reports")
    Task.objects.ensure("mail-2", queue="mail")
    [mail] = Task.objects.claim_next(queue="mail")
    assert [c.key for c in mail.complete_and_claim_next(queue=["reports"], limit=5)] == ["report-1"]


def test_complete_and_claim_next_claims_work_of_the_completed_tasks_kind() -> None:
    """A Django task's completion claims Django tasks, a handler's claims handler work; a
    handler's claim never picks up a task that names its callable, nor the reverse."""
    Task.objects.ensure("for-a-handler", queue="default")
    Task.objects.ensure("django-1", queue="default", task_path="shop.tasks.charge")
    Task.objects.ensure("django-2", queue="default", task_path="shop.tasks.charge")
    Task.objects.ensure("for-a-handler-2", queue="default")
    [django_task] = Task.objects.claim_next(path="*")
    assert django_task.key == "django-1"
    assert [c.key for c in django_task.complete_and_claim_next(limit=5)] == ["django-2"]
    [handler_work] = Task.objects.claim_next(path="")
    assert handler_work.key == "for-a-handler"
    assert [c.key for c in handler_work.complete_and_claim_next(limit=5)] == ["for-a-handler-2"]


def test_complete_and_claim_next_claims_with_the_completed_claims_lease_and_owner_unless_told() -> None:
    for key in ("a", "b", "c"):
        Task.objects.ensure(key, queue="default")
    [first] = Task.objects.claim_next(owner="w", lease=77)
    [second] = first.complete_and_claim_next()
    assert (second.key, second.owner, second.lease) == ("b", "w", 77)
    row = Task.objects.get(key="b")
    assert 70 < (row.lease_expires_at - row.updated_at).total_seconds() <= 77
    [third] = second.complete_and_claim_next(lease=12)
    assert (third.key, third.lease) == ("c", 12)
    row = Task.objects.get(key="c")
    assert 10 < (row.lease_expires_at - row.updated_at).total_seconds() <= 12


def test_a_claim_takes_the_lease_it_is_given_in_the_database_too() -> None:
    """The lease a call names is the one the database counts (a default of 30 would hide a lease
    ignored on the way down)."""
    Task.objects.ensure("q", queue="default")
    claim = Task.objects.claim("by-key", lease=77).claim
    [queued] = Task.objects.claim_next(lease=88)
    for got, seconds in ((claim, 77), (queued, 88)):
        assert got is not None and got.lease == seconds
        row = Task.objects.get(pk=got.task_id)
        assert seconds - 5 < (row.lease_expires_at - row.updated_at).total_seconds() <= seconds


def test_a_handler_claim_never_takes_a_task_that_names_its_callable_nor_the_reverse() -> None:
    """Asked first (so that nothing was claimed before it): ``path="*"`` takes no handler work,
    ``path=""`` no Django task."""
    Task.objects.ensure("for-a-handler", queue="default")
    Task.objects.ensure("a-django-task", queue="default", task_path="shop.tasks.charge")
    assert [c.key for c in Task.objects.claim_next(limit=5, path="*")] == ["a-django-task"]
    Task.objects.filter(key="a-django-task").update(status="pending", owner="", lease_expires_at=None)
    assert [c.key for c in Task.objects.claim_next(limit=5, path="")] == ["for-a-handler"]
    assert list(Task.objects.queued("default", "*").values_list("key", flat=True)) == ["a-django-task"]
    assert list(Task.objects.queued("default", "").values_list("key", flat=True)) == ["for-a-handler"]


# -- a handler's retry, a worker's lease, run_once's lease ------------------------------------------
@override_settings(TASKCLAIM_RETRY_BACKOFF={"base": 100, "factor": 2, "jitter": 0})
def test_a_queued_tasks_retry_waits_the_settings_backoff_for_the_attempt_that_failed() -> None:
    import datetime as dt

    from django.utils import timezone

    def retried(claim: Any, **delay: Any) -> float:
        assert claim.fail("boom", retry=True, **delay) == Task.Status.PENDING
        row = Task.objects.get(pk=claim.task_id)
        wait = (row.run_after - row.updated_at).total_seconds()
        Task.objects.filter(pk=claim.task_id).update(run_after=timezone.now() - dt.timedelta(seconds=1))
        return wait

    Task.objects.ensure("job", queue="default", max_attempts=5)
    assert retried(Task.objects.claim_next()[0]) == pytest.approx(100, abs=0.01)  # attempt 1: base
    assert retried(Task.objects.claim_next()[0]) == pytest.approx(200, abs=0.01)  # attempt 2: base * factor
    assert retried(Task.objects.claim_next()[0], delay=7) == pytest.approx(7, abs=0.01)  # told: as told
    by_key = Task.objects.claim("by-key", max_attempts=5).claim
    assert by_key is not None and by_key.fail("boom", retry=True) == Task.Status.PENDING
    assert Task.objects.get(key="by-key").run_after is None  # claimed by key: retried by its next claim


@pytest.mark.django_db(transaction=True)
def test_work_claims_with_its_lease_else_the_setting_and_passes_it_on_to_the_next_claims() -> None:
    from django_taskclaim.worker import work

    for key in ("a", "b", "c"):
        Task.objects.ensure(key, queue="default")
    leases: list[float] = []
    work(lambda claim: leases.append(claim.lease), lease=77, batch=2, until_drained=True, poll=0.01)
    assert leases == [77, 77, 77]  # a batch's claims, and those its completion made
    Task.objects.ensure("d", queue="default")
    with override_settings(TASKCLAIM_DEFAULT_LEASE=55):
        work(lambda claim: leases.append(claim.lease), until_drained=True, poll=0.01)
    assert leases[-1] == 55


@pytest.mark.django_db(transaction=True)
def test_run_once_and_arun_once_claim_with_the_lease_they_are_given() -> None:
    from django_taskclaim import arun_once, run_once
    from django_taskclaim.lifecycle.execution import current_claim
    from django_taskclaim.once import run_once_with
    from tests.core.test_async import run

    def lease_held() -> float:
        claim = current_claim()
        row = Task.objects.get(pk=claim.task_id)
        assert claim.lease - 5 < (row.lease_expires_at - row.updated_at).total_seconds() <= claim.lease
        return claim.lease

    async def alease_held() -> float:
        from asgiref.sync import sync_to_async

        return await sync_to_async(lease_held)()

    assert run_once("a", lease_held, lease=77) == 77
    assert run_once_with("b", lease=66)(lease_held) == 66
    assert run(arun_once("c", alease_held, lease=88)) == 88
    with override_settings(TASKCLAIM_DEFAULT_LEASE=55):
        assert run_once("d", lease_held) == 55


@pytest.mark.django_db(transaction=True)
def test_afail_takes_the_retry_delay_as_fail_does() -> None:
    """The awaitable twin of ``fail()`` had no ``delay``: an async worker could not say when to retry."""
    from tests.core.test_async import run

    Task.objects.ensure("job", queue="default")
    [claim] = Task.objects.claim_next()
    assert run(claim.afail("boom", retry=True, delay=7)) == Task.Status.PENDING
    row = Task.objects.get(pk=claim.task_id)
    assert (row.run_after - row.updated_at).total_seconds() == pytest.approx(7, abs=0.01)


@pytest.mark.skipif("shard2" not in django_settings.DATABASES, reason="the sharded configurations only")
@pytest.mark.django_db(transaction=True, databases="__all__")
def test_a_completion_claiming_in_the_other_database_takes_the_completed_tasks_queue_kind_and_lease() -> None:
    """``complete_and_claim_next(tenant=...)`` for a tenant of the other database: the same
    defaults as in its own (the claim there is a second statement, after this commit)."""
    from tests.sharding import ON_A, ON_B, B

    Task.objects.ensure("a", tenant=ON_A[0], queue="mail")
    Task.objects.ensure("b-default", tenant=ON_B[0], queue="default")
    Task.objects.ensure("b-handler", tenant=ON_B[0], queue="mail")
    Task.objects.ensure("b-django", tenant=ON_B[0], queue="mail", task_path="shop.tasks.charge")
    [a] = Task.objects.claim_next(tenant=ON_A[0], queue="mail", lease=77)
    [b] = a.complete_and_claim_next(tenant=ON_B[0], limit=5)
    assert (b.key, b.using, b.lease) == ("b-handler", B, 77)
