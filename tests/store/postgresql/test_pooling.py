"""Prepared statements under Django's connection pool, server-side binding and poolers.

The cycle tests run a worker process in the named configuration (tests/settings.py) against the
test database: 40 claim + complete cycles, each ended like a request (the connection closed,
with a pool: handed back, so the next cycle may run on another server session).
"""

from __future__ import annotations

import io

import django
import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection, connections
from django.test import override_settings

from django_taskclaim import checks
from django_taskclaim.models import Task

postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only")


def run_cycles(spawn, config: str, prepared: bool, n: int = 40) -> dict:  # type: ignore[no-untyped-def]
    proc = spawn("cycles", "--n", str(n), "--prefix", config,
                 env={"TASKCLAIM_TEST_CONFIG": config, "TASKCLAIM_TEST_PREPARED": "1" if prepared else "0"})
    return proc.finish(180)


@postgresql_only
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("config", ["pool", "server_side_binding"])
@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "plain"])
def test_claim_complete_cycles_all_succeed(spawn, config: str, prepared: bool) -> None:  # type: ignore[no-untyped-def]
    if config == "pool" and django.VERSION < (5, 1):
        pytest.skip("Django's connection pool is new in Django 5.1")
    # Before the fix, with prepared statements on: the pool failed 37 of 40 cycles ("prepared
    # statement … already exists"), server-side binding all 40 ("could not determine data type
    # of parameter $1").
    report = run_cycles(spawn, config, prepared)
    assert (report["ok"], report["failed"]) == (40, 0), report["errors"]
    assert Task.objects.filter(key__startswith=f"{config}-", status="succeeded").count() == 40



@pytest.fixture
def behind_transaction_pooler(monkeypatch):  # type: ignore[no-untyped-def]
    """The task database as Django's docs set it up behind PgBouncer in transaction mode."""
    db = connections["default"]
    monkeypatch.setattr(type(db), "vendor", "postgresql")
    monkeypatch.setitem(db.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)


@pytest.mark.usefixtures("behind_transaction_pooler")
@override_settings(TASKCLAIM_PREPARED_STATEMENTS=True)
def test_e010_prepared_statements_behind_a_transaction_mode_pooler() -> None:
    (error,) = checks.check_database()
    assert error.id == "django_taskclaim.E010" and "'default'" in error.msg
    assert "TASKCLAIM_PREPARED_STATEMENTS = False" in error.hint


@pytest.mark.usefixtures("behind_transaction_pooler")
@override_settings(TASKCLAIM_PREPARED_STATEMENTS=False)
def test_e010_silent_with_the_documented_setting() -> None:
    assert checks.check_database() == []


def test_e010_silent_without_a_transaction_mode_pooler() -> None:
    assert checks.check_database() == []  # prepared statements on, as by default: fine here


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_session_that_already_has_statements_of_these_names_is_used_as_is() -> None:
    # A session-mode pooler without DISCARD ALL hands a new client a session in which the
    # previous client prepared statements: psycopg's names (_pg3_0, _pg3_1, ...) are taken.
    connection.close()
    with connection.cursor() as cursor:  # a new connection: psycopg's names start again at _pg3_0
        for n in range(10):
            cursor.execute(f"PREPARE _pg3_{n} AS SELECT {n}")
    outcome = Task.objects.claim("second", owner="w")
    assert outcome.claim is not None
    outcome.claim.complete()
    assert Task.objects.get(key="second").status == Task.Status.SUCCEEDED
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ["%django_taskclaim_%"])
        assert cursor.fetchone()[0] == 2  # the fused claim and completion, prepared after all


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_with_autocommit_off_a_lost_statement_is_an_error_not_a_retry_in_an_aborted_transaction() -> None:
    """With autocommit off the failed statement aborted the caller's transaction: report that error,
    and prepare afresh in the caller's next transaction."""
    from django.db import DatabaseError, transaction

    # "first" and "second" send the same claim statement: after the claim of "zero" inserted a
    # new task, the insert alone (see prepared.claim_hint).
    Task.objects.claim("zero", owner="w")
    Task.objects.claim("first", owner="w").claim.complete()  # type: ignore[union-attr]
    transaction.set_autocommit(False)
    try:
        with connection.cursor() as cursor:
            cursor.execute("DEALLOCATE ALL")  # psycopg still believes the claim is prepared
        with pytest.raises(DatabaseError, match="does not exist"):
            Task.objects.claim("second", owner="w")
        transaction.rollback()
        third = Task.objects.claim("third", owner="w").claim  # prepared again in the new transaction
        assert third is not None
        third.complete()
        transaction.commit()
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)
    assert Task.objects.get(key="third").status == Task.Status.SUCCEEDED
    assert not Task.objects.filter(key="second").exists()


@pytest.mark.usefixtures("behind_transaction_pooler")
@override_settings(TASKCLAIM_PREPARED_STATEMENTS=True)
@pytest.mark.django_db  # Django 6.1+: `check` runs the model checks on every database (a query)
def test_e010_stops_manage_py_check() -> None:
    with pytest.raises(SystemCheckError, match="E010"):
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())
