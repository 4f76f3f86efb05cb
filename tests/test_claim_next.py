"""Queue-style claims: order, limits, tenants, takeover of expired leases."""

from __future__ import annotations

import pytest

from django_taskclaim.models import Attempt, Task
from tests.conftest import expire

pytestmark = pytest.mark.django_db


def test_claims_the_oldest_pending_first_up_to_limit() -> None:
    for i in range(5):
        Task.objects.ensure(f"t{i}")
    first = Task.objects.claim_next(owner="w", limit=2)
    assert [c.key for c in first] == ["t0", "t1"]
    assert all(c.token == 1 and c.owner == "w" for c in first)
    assert [c.key for c in Task.objects.claim_next(limit=10)] == ["t2", "t3", "t4"]
    assert Task.objects.claim_next() == []
    assert Task.objects.running().count() == 5
    assert Attempt.objects.filter(outcome="running").count() == 5


def test_expired_leases_are_taken_over_before_pending_work() -> None:
    Task.objects.ensure("old")
    (old,) = Task.objects.claim_next(owner="w1")
    Task.objects.ensure("new")
    expire(old)
    (taken,) = Task.objects.claim_next(owner="w2")
    assert (taken.key, taken.token) == ("old", 2)
    assert Attempt.objects.get(token=1, task__key="old").outcome == "taken_over"
    assert [c.key for c in Task.objects.claim_next()] == ["new"]


def test_exhausted_expired_tasks_are_not_taken_over() -> None:
    Task.objects.ensure("job", max_attempts=1)
    (claim,) = Task.objects.claim_next()
    expire(claim)
    assert Task.objects.claim_next() == []
    assert Task.objects.reclaim_expired() == 1
    assert Task.objects.get(key="job").status == "failed"


def test_tenant_filter() -> None:
    Task.objects.ensure("a", tenant="acme")
    Task.objects.ensure("b", tenant="globex")
    assert [c.tenant for c in Task.objects.claim_next(tenant="globex", limit=5)] == ["globex"]
    assert [c.tenant for c in Task.objects.claim_next(tenant="acme", limit=5)] == ["acme"]
    assert Task.objects.claim_next(tenant="acme") == []


def test_finished_and_running_tasks_are_skipped() -> None:
    Task.objects.ensure("done")
    Task.objects.claim_next()[0].complete(1)
    Task.objects.ensure("busy")
    Task.objects.claim_next()
    assert Task.objects.claim_next(limit=5) == []


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_bad_limit(limit: object) -> None:
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        Task.objects.claim_next(limit=limit)  # type: ignore[arg-type]


@pytest.mark.django_db(transaction=True)
def test_a_locked_row_is_skipped_not_waited_for() -> None:
    """PostgreSQL, MySQL: claim_next passes over a row another transaction holds (SKIP LOCKED)."""
    import threading

    from django.db import connection, connections, transaction

    if connection.vendor == "sqlite":
        pytest.skip("SQLite has one writer: there is no row lock to skip")
    Task.objects.ensure("held")
    Task.objects.ensure("free")
    out: dict[str, object] = {}

    def other_worker() -> None:
        try:
            out["keys"] = [c.key for c in Task.objects.claim_next(limit=5)]
        finally:
            connections.close_all()

    with transaction.atomic():
        Task.objects.select_for_update().get(key="held")  # another claimer, mid-transaction
        thread = threading.Thread(target=other_worker, daemon=True)
        thread.start()
        thread.join(30)
        waited = thread.is_alive()
    thread.join(30)
    assert not waited, "claim_next waited for a row lock instead of skipping the row"
    assert out["keys"] == ["free"]
