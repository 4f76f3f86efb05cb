"""MySQL/MariaDB: a database whose character set is not utf8mb4 stores any Unicode once migrated.

Each case creates a database of that character set on the test server and runs a worker process
on it (``tests/programs/charset_worker.py``): with 0003's conversion skipped, the text columns keep the database's
set, and text beyond it is refused (strict mode: error 1366, the failure never lands) or stored
as ``?`` (otherwise: a worker no longer recognises its own claims); migrated to 0003, everything
is stored as written. The checks E022 and E023 refuse a connection or a column that cannot.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import django
import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection

from devtools.processes import Supervisor
from django_taskclaim.checks import check_database, check_database_server
from tests.programs.charset_worker import DELIVERY, ERROR, OWNER

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "mysql", reason="MySQL/MariaDB character sets"),
]

MYSQL_INCORRECT_STRING = 1366


@pytest.fixture(params=["latin1", "utf8mb3"])
def narrow_database(request: pytest.FixtureRequest) -> Iterator[str]:
    """An empty database of character set ``latin1`` or ``utf8mb3`` on the test server."""
    name = f"taskclaim_{request.param}_{id(request)}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET {request.param}")
    try:
        yield name
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")


def run_worker(processes: Supervisor, database: str, *args: str) -> dict[str, Any]:
    return processes.start("tests.programs.charset_worker", *args, env={"TASKCLAIM_TEST_DB_NAME": database}).finish(180)


def test_before_0003_strict_mode_refuses_the_text_and_the_failure_never_lands(processes, narrow_database) -> None:  # type: ignore[no-untyped-def]
    report = run_worker(processes, narrow_database, "--skip-0003", "--sql-mode", "strict")
    assert report["fail_error"] == ["OperationalError", MYSQL_INCORRECT_STRING]
    assert report["fail_status"] == "running"  # stranded until its lease runs out
    assert report["claim_next_error"] == ["OperationalError", MYSQL_INCORRECT_STRING]
    assert report["delivery_error"] == ["OperationalError", MYSQL_INCORRECT_STRING]
    assert report["checks"] == ["django_taskclaim.E023"]  # 0003 recorded as run, its columns still narrow


def test_before_0003_other_modes_mangle_the_owner_and_the_worker_loses_its_claims(processes, narrow_database) -> None:  # type: ignore[no-untyped-def]
    report = run_worker(processes, narrow_database, "--skip-0003", "--sql-mode", "loose")
    assert report["next_owner"] == "worker-?" and report["next_status"] == "running"
    assert report["claim_next"] == []  # marked running, and handed to nobody
    assert report["fail_stored"] != ERROR and "?" in report["fail_stored"]


@pytest.mark.parametrize("mode", ["strict", "loose"])
def test_after_0003_every_text_column_stores_any_unicode(processes, narrow_database, mode: str) -> None:  # type: ignore[no-untyped-def]
    report = run_worker(processes, narrow_database, "--sql-mode", mode)
    assert not [k for k in report if k.endswith("_error")], report
    assert (report["fail_status"], report["fail_stored"]) == ("failed", ERROR)
    assert report["claim_next"] == ["job-next"] and report["next_owner"] == OWNER
    assert report["delivery_stored"] == DELIVERY and report["done_result"] == {"message": ERROR}
    assert report["checks"] == []


@pytest.mark.parametrize(("charset", "refused"), [("utf8", True), ("latin1", True), ("utf8mb4", False),
                                                  (None, django.VERSION < (5, 2))])
def test_e022_a_connection_character_set_other_than_utf8mb4(monkeypatch, charset: str | None,  # type: ignore[no-untyped-def]
                                                           refused: bool) -> None:
    options = {k: v for k, v in connection.settings_dict["OPTIONS"].items() if k != "charset"}
    if charset is not None:
        options["charset"] = charset
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    found = [m for m in check_database() if m.id == "django_taskclaim.E022"]
    if refused:
        [error] = found
        assert repr(charset or "utf8") in error.msg and "'charset'] = 'utf8mb4'" in error.hint
    else:
        assert found == []


def test_e023_a_task_table_column_that_is_not_utf8mb4() -> None:
    assert check_database_server(databases=["default"]) == []
    with connection.cursor() as cursor:
        # Put back as it was, collation too: another collation of utf8mb4 would make the admin's
        # join with django_celery_results fail ("Illegal mix of collations") in later tests.
        cursor.execute("SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
                       "AND TABLE_NAME = 'django_taskclaim_attempt' AND COLUMN_NAME = 'delivery_id'")
        [collation] = cursor.fetchone()
        cursor.execute("ALTER TABLE django_taskclaim_attempt MODIFY delivery_id varchar(255) "
                       "CHARACTER SET latin1 NOT NULL")
    try:
        # The database checks only where asked (check --database, migrate).
        assert check_database() == [] and check_database_server() == []
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())
        [error] = check_database_server(databases=["default"])
        assert error.id == "django_taskclaim.E023"
        assert "django_taskclaim_attempt.delivery_id" in error.msg and "latin1" in error.msg
        assert "0003_mysql_utf8mb4" in error.hint
        with pytest.raises(SystemCheckError, match="E023"):
            call_command("check", "--database", "default", stdout=io.StringIO(), stderr=io.StringIO())
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE django_taskclaim_attempt MODIFY delivery_id varchar(255) "  # noqa: S608
                           f"CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL")
