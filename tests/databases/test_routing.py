"""Tenants routed over task databases: the router, its settings and checks (every configuration).

With one database the router can still be set (every tenant sent to the one database); the
sharded configurations (tests/databases/test_sharded.py) run two real servers.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections
from django.test import override_settings

from django_taskclaim import checks, routing
from django_taskclaim.conf import settings as tc_settings
from django_taskclaim.exceptions import TaskClaimError
from django_taskclaim.models import Task
from django_taskclaim.tasks.results import parse_result_id

pytestmark = pytest.mark.django_db(transaction=True)


class Counting:
    """A router that sends every tenant to ``alias`` and counts its calls."""

    def __init__(self, alias: str) -> None:
        self.alias, self.calls = alias, 0

    def __call__(self, tenant: str) -> str:
        self.calls += 1
        return self.alias


def ids(found: list[Any]) -> list[str]:
    return [m.id for m in found]


# ---- the route ------------------------------------------------------------------------------

@override_settings(TASKCLAIM_ROUTER=None, TASKCLAIM_DATABASES=None)
def test_without_a_router_every_tenant_is_in_the_task_database() -> None:
    assert tc_settings.ROUTER is None
    assert routing.route("acme") == tc_settings.DATABASE
    assert routing.route("acme", "elsewhere") == "elsewhere"  # an explicit alias, as before routing
    assert routing.databases() == tuple(tc_settings.DATABASES)


def test_the_router_is_asked_once_per_claim_and_its_database_is_the_claims() -> None:
    router = Counting(tc_settings.DATABASE)
    with override_settings(TASKCLAIM_ROUTER=router, TASKCLAIM_DATABASES=list(tc_settings.DATABASES)):
        outcome = Task.objects.claim("job", tenant="acme")
        assert router.calls == 1
        assert outcome.claim is not None and outcome.claim.using == tc_settings.DATABASE
        outcome.claim.complete("done")  # an owner write goes to claim.using: no route
        assert router.calls == 1
        assert Task.objects.for_tenant("acme").get(key="job").status == "succeeded"


def test_a_database_the_router_does_not_list_is_refused_before_anything_is_written() -> None:
    with override_settings(TASKCLAIM_ROUTER=Counting("nowhere"), TASKCLAIM_DATABASES=list(tc_settings.DATABASES)):
        with pytest.raises(TaskClaimError, match=r"sent tenant 'acme' to database 'nowhere', which is not one"):
            Task.objects.claim("job", tenant="acme")
        with pytest.raises(TaskClaimError, match="'nowhere'"):
            Task.objects.ensure("job", tenant="acme")
        with pytest.raises(TaskClaimError, match="'nowhere'"):
            Task.objects.claim_next(tenant="acme")
    assert not Task.objects.exists()


def test_an_explicit_database_that_does_not_hold_the_tenant_is_refused() -> None:
    """Two databases could each hold the same (tenant, key): one owner in each. Refused, nothing written."""
    router = Counting(tc_settings.DATABASE)
    with (override_settings(TASKCLAIM_ROUTER=router, TASKCLAIM_DATABASES=list(tc_settings.DATABASES)),
          pytest.raises(TaskClaimError, match=r"tenant 'acme' lives in database .* not in 'other'")):
        Task.objects.db_manager("other").claim("job", tenant="acme")
    assert not Task.objects.exists()


def test_the_task_database_defaults_to_the_first_one_listed() -> None:
    with override_settings(TASKCLAIM_DATABASES=["first", "second"]):
        assert tc_settings.DATABASE == "first" and tc_settings.DATABASES == ("first", "second")
        with override_settings(TASKCLAIM_DATABASE="second"):
            assert tc_settings.DATABASE == "second"


# ---- checks ---------------------------------------------------------------------------------

def errors_of(**overrides: Any) -> list[tuple[str, str]]:
    with override_settings(**{"TASKCLAIM_ROUTER": None, **overrides}):
        return [(e.id, e.msg) for e in checks.check_routing()]


def test_the_sharded_settings_pass_their_checks() -> None:
    assert checks.check_routing() == []


def test_e007_a_router_that_cannot_be_used() -> None:
    databases = list(tc_settings.DATABASES)
    (found,) = errors_of(TASKCLAIM_ROUTER="tests.routers.no_such_router", TASKCLAIM_DATABASES=databases)
    assert found[0] == "django_taskclaim.E007" and "cannot be imported" in found[1]
    (found,) = errors_of(TASKCLAIM_ROUTER="tests.routers.WITH_TASKS", TASKCLAIM_DATABASES=databases)
    assert found[0] == "django_taskclaim.E007" and "is not callable" in found[1]

    def broken(tenant: str) -> str:
        raise KeyError(tenant)

    (found,) = errors_of(TASKCLAIM_ROUTER=broken, TASKCLAIM_DATABASES=databases)
    assert found[0] == "django_taskclaim.E007" and "router('') raised KeyError" in found[1]


def test_e008_task_databases_that_are_not_configured() -> None:
    configured = tc_settings.DATABASE
    assert [i for i, _ in errors_of(TASKCLAIM_DATABASES="default")] == ["django_taskclaim.E008"]
    assert [m for _, m in errors_of(TASKCLAIM_DATABASES=[configured, "ghost"])] == [
        f"TASKCLAIM_DATABASES = [{configured!r}, 'ghost'] is invalid: 'ghost' is not in DATABASES."]
    found = errors_of(TASKCLAIM_DATABASES=[configured, configured])
    assert found and all(i == "django_taskclaim.E008" for i, _ in found) and "listed twice" in found[0][1]
    missing = errors_of(TASKCLAIM_DATABASES=[a for a in connections if a != configured] or ["ghost"],
                        TASKCLAIM_DATABASE=configured)
    assert any(f"TASKCLAIM_DATABASE = {configured!r} is not in it" in m for _, m in missing)
    found = errors_of(TASKCLAIM_DATABASES=[configured, "x" * 45])
    assert any("'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' is longer than 44 characters" in m for _, m in found)


def test_e009_a_router_that_sends_tenants_to_an_unlisted_database() -> None:
    databases = list(tc_settings.DATABASES)
    (found,) = errors_of(TASKCLAIM_ROUTER=Counting("elsewhere"), TASKCLAIM_DATABASES=databases)
    assert found == ("django_taskclaim.E009", f"TASKCLAIM_ROUTER sends the empty tenant '' to 'elsewhere', which "
                     f"is not in TASKCLAIM_DATABASES ({', '.join(map(repr, databases))}).")
    declared = Counting(tc_settings.DATABASE)
    declared.databases = (tc_settings.DATABASE, "shard9")  # type: ignore[attr-defined]
    (found,) = errors_of(TASKCLAIM_ROUTER=declared, TASKCLAIM_DATABASES=databases)
    assert found[0] == "django_taskclaim.E009" and "'shard9'" in found[1] and "'databases' attribute" in found[1]


# ---- what identifies a task among databases ------------------------------------------------

@pytest.mark.parametrize("text", ["", "abc", "-1", " 42", "4_2", "+7", "x:1", "default:", "default:a", "٣", ":42",
                                  "::42", ":default:42"])
def test_a_result_id_that_names_no_task_database_row_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="result id|names no task database"):
        parse_result_id(text)


def test_a_result_id_names_its_database() -> None:
    assert parse_result_id(f"{tc_settings.DATABASE}:42") == (tc_settings.DATABASE, 42)
    if routing.several():  # a bare pk is a task of each database: none is guessed
        with pytest.raises(ValueError, match="'alias:pk'"):
            parse_result_id("42")
    else:
        assert parse_result_id("42") == (tc_settings.DATABASE, 42)


@pytest.mark.parametrize(("sql", "write"), [
    ("SELECT 1", False), ("  select * from t for update", False), ("SAVEPOINT s1", False),
    ("INSERT INTO t VALUES (1)", True), ("update t set a = 1", True), ("DELETE FROM t", True),
    ("WITH x AS (UPDATE t SET a = 1 RETURNING *) SELECT * FROM x", True),
    ("WITH x AS (SELECT 1) SELECT * FROM x", False),
    ("CREATE TABLE t (a int)", True), ("TRUNCATE t", True), ("(SELECT 1)", False), ("", False),
])
def test_what_fenced_counts_as_a_write(sql: str, write: bool) -> None:
    assert routing.is_write(sql) is write
