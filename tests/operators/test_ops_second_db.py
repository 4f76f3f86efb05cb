"""``TASKCLAIM_DATABASE`` naming a second database alias: every command, the admin and the
metrics read the task table (and its attempts) there, not the default database.

Self-contained: a process of its own with ``tests.settings_ops`` adds the ``tasks`` alias (a
new SQLite file, or a new PostgreSQL database on the suite's server) and migrates it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tasks_db(tmp_path: Path) -> Iterator[str]:
    """The NAME of a fresh, empty database for the ``tasks`` alias."""
    if connection.vendor == "sqlite":
        yield str(tmp_path / "tasks.sqlite3")
        return
    name = f"test_taskclaim_tasks_{uuid.uuid4().hex[:8]}"
    quoted = connection.ops.quote_name(name)
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {quoted}")
    try:
        yield name
    finally:
        force = " WITH (FORCE)" if connection.vendor == "postgresql" else ""
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {quoted}{force}")


def test_every_operator_surface_reads_the_configured_database(processes, tasks_db) -> None:  # type: ignore[no-untyped-def]
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings_ops", "TASKCLAIM_TEST_TASKS_DB": tasks_db}
    report = processes.start("tests.programs.ops", "second-db", env=env).finish(180)
    assert report["default_db_tasks"] == 0  # nothing leaked into the default database
    # Regression: the audit read the default database and reported "ok".
    audit = report["audit"]
    assert audit["code"] == 1 and audit["doc"]["overlaps"]["count"] == 1, audit
    assert audit["doc"]["overlaps"]["items"][0]["key"] == "ran-twice"
    inspect = report["inspect"]
    assert inspect["code"] == 0
    assert [a["owner"] for a in inspect["doc"]["attempts"]] == ["ghost-a", "ghost-b"]
    assert [r["key"] for r in report["reclaim"]["doc"]["reclaimed"]] == ["held"]
    assert report["purge"]["doc"]["tasks"] == 1
    assert report["admin_change"] == {"status": 200, "ghost-a": True}  # the attempts inline
    assert report["admin_list"] == {"status": 200, "held": True}
    assert report["metrics"] == {"running": 1.0, "expired": 1.0}
