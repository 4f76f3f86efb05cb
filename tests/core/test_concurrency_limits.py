"""Concurrency limits (issue 33 item 2): at most ``concurrency_limit`` tasks of one
``concurrency_key`` RUNNING at once, decided inside the queue claim."""

from __future__ import annotations

import pytest

from django_taskclaim.exceptions import InvalidArgument
from django_taskclaim.models import Task
from tests.conftest import expire

pytestmark = pytest.mark.django_db


def limited(key: str, group: str = "api", limit: int = 2, **options: object) -> Task:
    return Task.objects.ensure(key, queue="default", concurrency_key=group, concurrency_limit=limit, **options)


def test_ensure_stores_the_limit_on_the_task() -> None:
    task = limited("a", limit=3)
    task.refresh_from_db()
    assert (task.concurrency_key, task.concurrency_limit) == ("api", 3)


@pytest.mark.parametrize(("options", "problem"), [
    ({"concurrency_key": "api"}, "go together"),
    ({"concurrency_limit": 2}, "go together"),
    ({"concurrency_key": "api", "concurrency_limit": 0}, "positive integer"),
    ({"concurrency_key": "api", "concurrency_limit": True}, "positive integer"),
    ({"concurrency_key": "x" * 256, "concurrency_limit": 1}, "limit is 255"),
    ({"concurrency_key": 7, "concurrency_limit": 1}, "must be a string"),
])
def test_bad_limits_are_refused_with_a_clear_error(options: dict[str, object], problem: str) -> None:
    with pytest.raises(InvalidArgument, match=problem):
        Task.objects.ensure("a", queue="default", **options)


def test_a_limit_needs_queued_work() -> None:
    with pytest.raises(InvalidArgument, match="queued work"):
        Task.objects.ensure("a", concurrency_key="api", concurrency_limit=1)


def test_a_batch_claim_takes_no_more_than_the_limit() -> None:
    for i in range(5):
        limited(f"t{i}")
    claims = Task.objects.claim_next(owner="w", limit=10)
    assert [c.key for c in claims] == ["t0", "t1"]
    assert Task.objects.claim_next(limit=10) == []
    claims[0].complete()
    assert [c.key for c in Task.objects.claim_next(limit=10)] == ["t2"]


def test_claims_one_at_a_time_stop_at_the_limit() -> None:
    for i in range(3):
        limited(f"t{i}")
    assert [c.key for c in Task.objects.claim_next()] == ["t0"]
    assert [c.key for c in Task.objects.claim_next()] == ["t1"]
    assert Task.objects.claim_next() == []


def test_a_full_key_does_not_block_another_key() -> None:
    """No head-of-line blocking: 100 tasks of a full key ahead of one task of a free key, in
    priority order, and the claim takes the free key's task."""
    limited("held", group="full", limit=1, priority=10)
    (holder,) = Task.objects.claim_next(owner="w")
    for i in range(100):
        limited(f"full-{i}", group="full", limit=1, priority=10)
    limited("free-1", group="free", limit=1, priority=0)
    assert [c.key for c in Task.objects.claim_next(owner="w")] == ["free-1"]
    holder.complete()
    assert [c.key for c in Task.objects.claim_next(owner="w")] == ["full-0"]


def test_unlimited_work_beside_limited_work_is_claimed_as_before() -> None:
    limited("l0", limit=1)
    limited("l1", limit=1)
    Task.objects.ensure("free", queue="default")
    assert [c.key for c in Task.objects.claim_next(limit=10)] == ["l0", "free"]


def test_keys_count_apart() -> None:
    for group in ("a", "b"):
        for i in range(3):
            limited(f"{group}{i}", group=group, limit=1)
    assert sorted(c.key for c in Task.objects.claim_next(limit=10)) == ["a0", "b0"]


def test_a_dead_holders_slot_frees_when_its_lease_runs_out() -> None:
    """An expired holder still counts until it is taken over (so a holder that wakes up never runs
    beside its successor); the claim takes it over first, and the key stays at its limit."""
    limited("t0", limit=1)
    limited("t1", limit=1)
    (dead,) = Task.objects.claim_next(owner="dead")
    assert Task.objects.claim_next() == []
    expire(dead)
    (taken,) = Task.objects.claim_next(owner="next")
    assert (taken.key, taken.token) == ("t0", 2)
    assert Task.objects.claim_next() == []
    taken.complete()
    assert [c.key for c in Task.objects.claim_next()] == ["t1"]


@pytest.mark.parametrize("reserve", [False, True])
def test_a_takeover_and_a_pending_task_of_a_full_key_claimed_together_stay_within_the_limit(reserve: bool) -> None:
    """Issue 40, item 21: an expired holder counts toward its key's limit until it is taken over,
    in the claim that takes it over too. One claim of two finds the dead holder's task (a takeover,
    its place) and a pending task of the key: it takes the first only; were an expired holder not
    counted, both would run at once (the mutant this pins)."""
    limited("t0", limit=1)
    limited("t1", limit=1)
    (dead,) = Task.objects.claim_next(owner="dead")
    expire(dead)
    taken = Task.objects.claim_next(owner="next", limit=2, reserve=reserve)
    assert [(c.key, c.token) for c in taken] == [("t0", 2)]
    assert Task.objects.get(key="t1").status == Task.Status.PENDING
    assert Task.objects.claim_next(limit=2) == []
    taken[0].complete()
    assert [c.key for c in Task.objects.claim_next(limit=2)] == ["t1"]


def test_a_released_or_failed_holder_frees_its_slot() -> None:
    for i in range(3):
        limited(f"t{i}", limit=1, max_attempts=1)
    (first,) = Task.objects.claim_next()
    first.release()
    (again,) = Task.objects.claim_next()
    assert again.key == "t0"
    again.fail("boom")
    assert [c.key for c in Task.objects.claim_next()] == ["t1"]


def test_the_tasks_own_limit_decides() -> None:
    """A pending task is claimed while fewer of its key run than its own limit (a key whose tasks
    carry several limits: each is held to its own)."""
    first = limited("wide", limit=2)
    limited("narrow", limit=1)
    limited("wide2", limit=2)
    (wide,) = Task.objects.claim_next()
    assert wide.key == first.key
    # One runs: "narrow" (limit 1) waits, "wide2" (limit 2) goes.
    (wide2,) = Task.objects.claim_next()
    assert wide2.key == "wide2"
    wide.complete()
    assert Task.objects.claim_next() == []  # "wide2" still runs: "narrow" (limit 1) waits
    wide2.complete()
    assert [c.key for c in Task.objects.claim_next()] == ["narrow"]


def test_a_batch_keeps_each_keys_candidates_in_claim_order() -> None:
    """Within one claim, a key's candidates start in claim order while they fit: the key's running
    tasks plus a candidate's place among them within its own limit."""
    limited("a", limit=3)
    limited("b", limit=1)
    limited("c", limit=3)
    # "b" is second of its key: 0 running + place 2 > its limit 1. "c" is third: 3 <= 3.
    assert [c.key for c in Task.objects.claim_next(limit=10)] == ["a", "c"]


def test_complete_and_claim_next_respects_the_limit() -> None:
    for i in range(4):
        limited(f"t{i}", limit=2)
    first, second = Task.objects.claim_next(owner="w", limit=2)
    following = first.complete_and_claim_next(limit=5)
    assert [c.key for c in following] == ["t2"]


def test_unlimited_claims_never_call_the_gate_function() -> None:
    """PostgreSQL: a claim whose picked tasks have no concurrency key never calls taskclaim_fit()
    (unlimited work pays nothing for limits); a claim that picked a limited task calls it once."""
    from django.db import connection, transaction

    if connection.vendor != "postgresql":
        pytest.skip("taskclaim_fit() is PostgreSQL's")

    def fit_calls() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_get_xact_function_calls('taskclaim_fit(bigint[], bigint)'::regprocedure)")
            return int(cursor.fetchone()[0] or 0)

    for i in range(3):
        Task.objects.ensure(f"free-{i}", queue="default")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL track_functions = 'all'")
        first = Task.objects.claim_next(owner="w", limit=2)
        following = first[0].complete_and_claim_next()
        assert [c.key for c in [*first, *following]] == ["free-0", "free-1", "free-2"]
        assert fit_calls() == 0
        # (A task with a key that the claim did not pick may still call it where the plan scans the
        # table instead of taking the picked ids from the index: a tiny table's.)
        limited("l0", limit=1)
        assert [c.key for c in following[0].complete_and_claim_next()] == ["l0"]
        assert fit_calls() == 1
