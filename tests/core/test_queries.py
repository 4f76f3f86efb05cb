"""Round-trip budgets of the hot paths."""

from __future__ import annotations

import pytest
from django.db import connection

from django_taskclaim.models import Task
from tests.conftest import expire

# PostgreSQL: claims in autocommit, as workers make them (what its claim statement learns of a
# session is kept once the claim commits: see PostgreSQLStore.claim_key), each test in a session
# of its own. The others count the statements of a claim, inside the test's transaction (in
# autocommit their transaction adds its BEGIN and COMMIT): there SQLite writes first (a read's lock
# could not become the write lock while another connection writes), where in autocommit it reads
# first like MySQL.
pytestmark = pytest.mark.django_db(transaction=connection.vendor == "postgresql")


def budget(pg: int, sqlite: int, mysql: int | None = None) -> int:
    """Round trips per database. MySQL has no RETURNING: a write and a read of what it wrote.

    MySQL reads the task before a claim by key writes (``Store.looks_first``): its write would
    wait for whoever holds the row, and a duplicate is answered from the read. SQLite does too in
    autocommit, not inside a caller's transaction (these tests'), where its write goes first."""
    return {"postgresql": pg, "sqlite": sqlite}.get(connection.vendor, sqlite if mysql is None else mysql)


def test_claim_of_a_new_key(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    # PostgreSQL: INSERT … ON CONFLICT … RETURNING with the audit rows in CTEs, one statement.
    # SQLite (in the test's transaction): the upsert, the attempts. MySQL: the read (no row), the
    # INSERT, a read of the row, the attempt.
    with django_assert_num_queries(budget(1, 3, 4)):
        assert Task.objects.claim("new").claimed


def test_claim_of_an_existing_key(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    Task.objects.ensure("old")
    with django_assert_num_queries(budget(1, 3, 4)):  # MySQL: the read first
        assert Task.objects.claim("old").claimed


def test_takeover(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    expire(Task.objects.claim("job").claim)
    Task.objects.ensure("other")
    Task.objects.claim("other")  # PostgreSQL: after a claim of an existing task, the full claim statement
    # MySQL: the read, the UPDATE, a read of the row with the owner it took over, that attempt
    # closed, the new one.
    with django_assert_num_queries(budget(1, 3, 5)):
        assert Task.objects.claim("job").claimed


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's claim statements")
def test_the_claim_statement_follows_what_the_last_claim_met(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    # After a claim that inserted a new task, the next claim sends the insert alone (no update of
    # an existing task in it): one round trip for a new key, two for an existing one, after which
    # the full statement is sent again.
    Task.objects.claim("first")
    with django_assert_num_queries(1) as sent:
        assert Task.objects.claim("new").claimed
    assert "UPDATE" not in sent.captured_queries[0]["sql"]
    expire(Task.objects.claim("job").claim)
    with django_assert_num_queries(2) as sent:
        taken = Task.objects.claim("job", owner="second")
    assert taken.claimed and taken.claim.token == 2
    assert "UPDATE" in sent.captured_queries[1]["sql"]
    Task.objects.ensure("pending")
    with django_assert_num_queries(1):
        assert Task.objects.claim("pending").claimed  # after a takeover: the full statement
    with django_assert_num_queries(1):
        assert Task.objects.claim("new-2").claimed  # the full statement inserts too
    with django_assert_num_queries(1) as sent:
        assert Task.objects.claim("new-3").claimed  # and the insert alone again
    assert "UPDATE" not in sent.captured_queries[0]["sql"]
    attempts = Task.objects.get(key="job").attempt_set.order_by("token")
    assert [a.outcome for a in attempts] == ["taken_over", "running"]


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
        Task.objects.ensure(f"t{i}", queue="default")
    # SQLite: the expired tasks on their last attempt to FAILED, the claim, and per claim the
    # attempt it took over closed and its own opened.
    with django_assert_num_queries(budget(1, 2 + 2 * 3, 4 + 3)):
        assert len(Task.objects.claim_next(limit=3)) == 3


def test_without_audit_trail(settings, django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    settings.TASKCLAIM_AUDIT = False
    with django_assert_num_queries(budget(1, 1, 3)):
        claim = Task.objects.claim("job").claim
    with django_assert_num_queries(1):
        claim.complete()
    assert not Task.objects.get(key="job").attempt_set.exists()


def test_a_duplicate_delivery(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    # PostgreSQL, after a claim that inserted a new task: the insert alone claims nothing and
    # writes nothing (no WAL flush at its commit), then the full claim statement reads the task
    # and records the duplicate, committed asynchronously. After a claim that met a task it could
    # not claim, the full statement is sent first: the common duplicate (a task that existed
    # before the statement) is one round trip. MySQL: the read, then the duplicate's row. SQLite
    # (in the test's transaction): the write that claims nothing, the read, then the duplicate's
    # row with a shorter busy timeout for it (set and restored).
    Task.objects.claim("job", owner="winner")
    with django_assert_num_queries(budget(2, 5, 2)):
        outcome = Task.objects.claim("job", owner="loser", delivery_id="d-2")
    assert not outcome.claimed and outcome.task.owner == "winner"
    with django_assert_num_queries(budget(1, 5, 2)):
        again = Task.objects.claim("job", owner="loser", delivery_id="d-3")
    assert not again.claimed and again.task.owner == "winner"
    attempts = Task.objects.get(key="job").attempt_set
    assert attempts.filter(outcome="duplicate", delivery_id__in=["d-2", "d-3"]).count() == 2
    Task.objects.claim("other", owner="w")  # a claim that inserted: the insert alone comes first again
    with django_assert_num_queries(budget(2, 5, 2)):
        assert not Task.objects.claim("job", owner="loser").claimed
