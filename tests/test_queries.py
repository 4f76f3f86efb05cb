"""Round-trip budgets of the hot paths."""

from __future__ import annotations

import pytest
from django.db import connection

from django_taskclaim.models import Task
from tests.conftest import expire

pytestmark = pytest.mark.django_db


def budget(pg: int, sqlite: int, mysql: int | None = None) -> int:
    """Round trips per database. MySQL has no RETURNING: a write and a read of what it wrote."""
    return {"postgresql": pg, "sqlite": sqlite}.get(connection.vendor, sqlite if mysql is None else mysql)


def test_claim_of_a_new_key(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    # PostgreSQL: INSERT … ON CONFLICT … RETURNING with the audit rows in CTEs, one statement.
    # MySQL: the conditional UPDATE (no row), the INSERT, a read of the row, the attempt.
    with django_assert_num_queries(budget(1, 3, 4)):
        assert Task.objects.claim("new").claimed


def test_claim_of_an_existing_key(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    Task.objects.ensure("old")
    with django_assert_num_queries(budget(1, 3)):
        assert Task.objects.claim("old").claimed


def test_takeover(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    expire(Task.objects.claim("job").claim)
    # MySQL: the UPDATE, a read of the row with the owner it took over, that attempt closed, the new one.
    with django_assert_num_queries(budget(1, 3, 4)):
        assert Task.objects.claim("job").claimed


def test_heartbeat_complete_fail_release(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    claim = Task.objects.claim("a").claim
    with django_assert_num_queries(budget(1, 1, 2)):
        claim.heartbeat()
    with django_assert_num_queries(budget(1, 2)):
        claim.complete({"ok": 1})
    claim = Task.objects.claim("b").claim
    with django_assert_num_queries(budget(1, 2, 3)):  # MySQL reads which status the failure chose
        claim.fail("x", retry=True)
    claim = Task.objects.claim("b").claim
    with django_assert_num_queries(budget(1, 2)):
        claim.release()


def test_claim_next(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    for i in range(3):
        Task.objects.ensure(f"t{i}")
    with django_assert_num_queries(budget(1, 1 + 2 * 3, 4 + 3)):
        assert len(Task.objects.claim_next(limit=3)) == 3


def test_without_audit_trail(settings, django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    settings.TASKCLAIM_AUDIT = False
    with django_assert_num_queries(budget(1, 1, 3)):
        claim = Task.objects.claim("job").claim
    with django_assert_num_queries(1):
        claim.complete()
    assert not Task.objects.get(key="job").attempt_set.exists()


def test_a_duplicate_delivery(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    # PostgreSQL, after a claim that claimed: the claim statement claims nothing and writes
    # nothing (no WAL flush at its commit), then one statement reads the task and records the
    # duplicate, committed asynchronously. After a claim that met a task it could not claim, the
    # claim statement itself reads the task and records the duplicate (the task existed before
    # the statement: the common duplicate, one round trip). MySQL: the UPDATE and the INSERT
    # both refused, then the read and the duplicate's row.
    Task.objects.claim("job", owner="winner")
    with django_assert_num_queries(budget(2, 3, 4)):
        outcome = Task.objects.claim("job", owner="loser", delivery_id="d-2")
    assert not outcome.claimed and outcome.task.owner == "winner"
    with django_assert_num_queries(budget(1, 3, 4)):
        again = Task.objects.claim("job", owner="loser", delivery_id="d-3")
    assert not again.claimed and again.task.owner == "winner"
    attempts = Task.objects.get(key="job").attempt_set
    assert attempts.filter(outcome="duplicate", delivery_id__in=["d-2", "d-3"]).count() == 2
    Task.objects.claim("other", owner="w")  # a claim that claimed: the next is lean again
    with django_assert_num_queries(budget(2, 3, 4)):
        assert not Task.objects.claim("job", owner="loser").claimed
