"""System checks: each ID triggers under its bad setting, and the checks are registered."""

from __future__ import annotations

import inspect
import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections
from django.test import override_settings

from django_taskclaim import checks


def ids(messages) -> list[str]:  # type: ignore[no-untyped-def]
    return [m.id for m in messages]


def test_clean_configuration_passes() -> None:
    assert checks.check_database() == [] and checks.check_settings() == []


def test_e001_unsupported_database(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(type(connections["default"]), "vendor", "oracle")
    (error,) = checks.check_database()
    assert error.id == "django_taskclaim.E001" and "oracle" in error.msg and error.hint


@pytest.mark.parametrize(("mariadb", "version", "refused"), [
    (True, (10, 5, 22), True), (True, (10, 6, 0), False), (True, (10, 11, 8), False),
    (False, (5, 7, 44), True), (False, (8, 0, 0), True), (False, (8, 0, 1), False), (False, (8, 4, 2), False),
])
def test_e002_mysql_and_mariadb_without_skip_locked(monkeypatch, mariadb: bool, version: tuple[int, ...],
                                                    refused: bool) -> None:
    from django_taskclaim.store import mysql

    class Server:
        mysql_is_mariadb = mariadb
        mysql_version = version

    problem = mysql.store.unsupported(Server())
    name = "MariaDB" if mariadb else "MySQL"
    if refused:
        assert problem is not None and problem.startswith(f"{name} {'.'.join(map(str, version))} is too old")
        assert "SKIP LOCKED" in problem
    else:
        assert problem is None
    if connections["default"].vendor == "mysql":  # the check itself, on the server under test
        monkeypatch.setattr(connections["default"], "mysql_is_mariadb", mariadb)
        monkeypatch.setattr(connections["default"], "mysql_version", version)
        assert ids(checks.check_database()) == (["django_taskclaim.E002"] if refused else [])


def test_e002_old_sqlite(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    if connections["default"].vendor != "sqlite":
        pytest.skip("SQLite only")
    from django_taskclaim.store import sqlite

    monkeypatch.setattr(sqlite.sqlite3, "sqlite_version_info", (3, 31, 1))
    monkeypatch.setattr(sqlite.sqlite3, "sqlite_version", "3.31.1")
    [error] = checks.check_database()
    assert error.id == "django_taskclaim.E002"
    assert "SQLite 3.31.1 is too old" in error.msg and "3.35" in error.msg


@override_settings(USE_TZ=False)
def test_e003_sqlite_without_use_tz() -> None:
    expected = ["django_taskclaim.E003"] if connections["default"].vendor in ("sqlite", "mysql") else []
    assert ids(checks.check_database()) == expected


@pytest.mark.parametrize("level", ["repeatable read", None])
def test_w021_mysql_isolation_level(monkeypatch, level: str | None) -> None:  # type: ignore[no-untyped-def]
    db = connections["default"]
    if db.vendor != "mysql":
        pytest.skip("MySQL/MariaDB only")
    monkeypatch.setitem(db.settings_dict, "OPTIONS", {**db.settings_dict["OPTIONS"], "isolation_level": level})
    [warning] = checks.check_database()
    assert warning.id == "django_taskclaim.W021" and repr(level) in warning.msg and "read committed" in warning.hint
    options = {**db.settings_dict["OPTIONS"], "isolation_level": "READ COMMITTED"}
    monkeypatch.setitem(db.settings_dict, "OPTIONS", options)
    assert checks.check_database() == []


@override_settings(TASKCLAIM_DATABASE="tasks")
def test_e004_unknown_alias() -> None:
    (error,) = checks.check_database()
    assert error.id == "django_taskclaim.E004" and "'tasks'" in error.msg and "default" in error.hint


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [("TASKCLAIM_DEFAULT_LEASE", "30", "expected int or float"), ("TASKCLAIM_DEFAULT_LEASE", 0, "greater than zero"),
     ("TASKCLAIM_MAX_ATTEMPTS", 2.5, "expected int"), ("TASKCLAIM_MAX_RESULT_BYTES", -1, "greater than zero"),
     ("TASKCLAIM_POLL_INTERVAL", True, "expected"), ("TASKCLAIM_DATABASE_TIMEOUT", 0, "greater than zero"),
     ("TASKCLAIM_DATABASE_TIMEOUT", "5", "expected int or float"),
     # Issue 40, item 13: a typo in the backoff crashed every worker after its claim; "no" was a yes.
     ("TASKCLAIM_RETRY_BACKOFF", {"bse": 2}, "unknown key(s) ['bse']"),
     ("TASKCLAIM_RETRY_BACKOFF", {"base": -1}, "must not be negative"),
     ("TASKCLAIM_RETRY_BACKOFF", [1, 2], "must be a Backoff or a dict"),
     ("TASKCLAIM_RETRY_BACKOFF", {"base": "soon"}, "finite number"),
     ("TASKCLAIM_AUDIT", "no", "expected True or False"),
     ("TASKCLAIM_PREPARED_STATEMENTS", 0, "expected True or False")],
)
def test_e005_bad_setting(name: str, value: object, problem: str) -> None:
    with override_settings(**{name: value}):
        (error,) = checks.check_settings()
    assert error.id == "django_taskclaim.E005" and name in error.msg and problem in error.msg


def test_a_good_backoff_and_booleans_pass() -> None:
    with override_settings(TASKCLAIM_RETRY_BACKOFF={"base": 2, "factor": 3}, TASKCLAIM_AUDIT=False,
                           TASKCLAIM_PREPARED_STATEMENTS=True):
        assert checks.check_settings() == []
    with override_settings(TASKCLAIM_RETRY_BACKOFF=None):
        assert checks.check_settings() == []


def test_w005_an_unknown_setting_is_named_with_the_closest_known_one() -> None:
    with override_settings(TASKCLAIM_DEFAULT_LEASES=60, TASKCLAIM_MAX_ATTEMPT=3, TASKCLAIM_FROBNICATE=1,
                           TASKCLAIM_SIGNING_KEY="secret", TASKCLAIM_AUDIT=True):
        found = checks.check_setting_names()
    assert ids(found) == ["django_taskclaim.W005"] * 3
    assert [m.msg for m in found] == [
        "TASKCLAIM_DEFAULT_LEASES is not a setting of django-taskclaim (did you mean TASKCLAIM_DEFAULT_LEASE?): "
        "it is ignored.",
        "TASKCLAIM_FROBNICATE is not a setting of django-taskclaim: it is ignored.",
        "TASKCLAIM_MAX_ATTEMPT is not a setting of django-taskclaim (did you mean TASKCLAIM_MAX_ATTEMPTS?): "
        "it is ignored."]
    assert all(m.hint for m in found)


def test_every_setting_the_package_reads_is_a_known_one() -> None:
    """W005's list is the package's: a setting added without it would be reported as a typo."""
    import re
    from pathlib import Path

    from django_taskclaim.conf import KNOWN_SETTINGS

    package = Path(checks.__file__).parent
    named = {name for path in package.rglob("*.py")
             for name in re.findall(r"\bTASKCLAIM_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text())}
    assert named <= KNOWN_SETTINGS, sorted(named - KNOWN_SETTINGS)


# Django 6.1+ runs every check against every database alias by default: the model checks
# then ask SQLite whether it supports JSON fields, a query (Django ticket #36663).
@pytest.mark.django_db
def test_checks_are_registered_with_django() -> None:
    call_command("check", stdout=io.StringIO())
    with override_settings(TASKCLAIM_MAX_ATTEMPTS=0), pytest.raises(SystemCheckError, match="E005"):
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())


def test_every_id_is_declared_once_and_tested() -> None:
    """IDs live with their checks (the app, each store, each integration), declared through one
    list that refuses an ID twice; every ID declared has a test that names it."""
    from pathlib import Path

    from django_taskclaim.checkspec import SPECS, spec

    with pytest.raises(RuntimeError, match="declared twice"):
        spec("django_taskclaim.E001", "again", "never")
    assert SPECS["django_taskclaim.E004"] is checks.E004
    # Registered by the app at start-up: every store's checks and every integration's.
    assert {"django_taskclaim.E002", "django_taskclaim.E010", "django_taskclaim.W020", "django_taskclaim.W021",
            "django_taskclaim.E101", "django_taskclaim.W106"} <= set(SPECS)
    this = inspect.getsource(test_every_id_is_declared_once_and_tested)
    rooms = Path(__file__).resolve().parents[1]  # tests/: every room's test files
    tests = "".join(path.read_text() for path in rooms.rglob("test_*.py")).replace(this, "")
    untested = [check_id for check_id in SPECS if check_id.rsplit(".", 1)[1] not in tests]
    assert not untested, untested


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("processes_option", [[], ["--processes", "2"]])
@pytest.mark.parametrize(("setting", "value"), [("TASKCLAIM_RETRY_BACKOFF", {"bse": 2}), ("TASKCLAIM_AUDIT", "no")])
def test_a_worker_refuses_to_start_with_a_setting_it_cannot_use_and_claims_nothing(  # type: ignore[no-untyped-def]
        processes, processes_option: list[str], setting: str, value: object) -> None:
    """Issue 40, item 13: with a typo in TASKCLAIM_RETRY_BACKOFF every worker crashed on its first
    task after claiming it (under --processes the task ended FAILED, its body never run). A worker
    never claims a task it cannot run because of its own configuration: exit 2, the task untouched."""
    from django_taskclaim.models import Task
    from tests.testapp import tasks

    result = tasks.add.enqueue(1, 2)
    worker = processes.start("django", "taskclaim_worker", "--until-drained", "--json", *processes_option,
                             env={"TASKCLAIM_TEST_SETTINGS": json.dumps({setting: value})})
    assert worker.wait(60) == 2, worker.stderr()
    assert "django_taskclaim.E005" in worker.stderr() and setting in worker.stderr()
    rows = Task.objects.filter(task_path="tests.testapp.tasks.add")
    assert [(r.status, r.attempts, r.fencing_token) for r in rows] == [(Task.Status.PENDING, 0, 0)]
    assert tasks.add.get_result(result.id).status == "READY"
