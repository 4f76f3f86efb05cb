"""A worker on a MySQL/MariaDB database of another character set: ``python -m tests.programs.charset_worker``.

It migrates the database named by ``TASKCLAIM_TEST_DB_NAME`` (with ``--skip-0003``: as a database
that never ran migration 0003's conversion, later migrations applied), then claims,
fails and completes tasks with text beyond Latin-1 and the Basic Multilingual Plane (emoji, CJK)
in every text column the app writes, and prints one JSON report of what was stored and refused.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from devtools.events import emit

OWNER = "worker-🙂"
ERROR = "💥 失败: ошибка"
DELIVERY = "投递-🙂"


def attempt(report: dict[str, Any], name: str, step: Any) -> Any:
    """Run ``step()``; record the database's refusal under ``name`` instead of raising it."""
    from django.db import DatabaseError

    try:
        return step()
    except DatabaseError as exc:
        report[f"{name}_error"] = [type(exc).__name__, exc.args[0] if exc.args else None]
        return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-0003", action="store_true",
                        help="mark 0003_mysql_utf8mb4 applied without running it (its columns stay narrow)")
    parser.add_argument("--sql-mode", choices=("strict", "loose"), default="strict")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from django_taskclaim.checks import check_database, check_database_server
    from django_taskclaim.models import Attempt, Task

    if args.skip_0003:
        call_command("migrate", "django_taskclaim", "0002", verbosity=0)
        call_command("migrate", "django_taskclaim", "0003", fake=True, verbosity=0)
    call_command("migrate", "django_taskclaim", verbosity=0)
    if args.sql_mode == "loose":
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION sql_mode = ''")
    report: dict[str, Any] = {"checks": [m.id for m in (*check_database(databases=["default"]),
                                                         *check_database_server(databases=["default"]))]}

    # fail() with an error message beyond Latin-1, by an owner of plain ASCII.
    claim = Task.objects.claim("job-fail", owner="worker-1").claim
    assert claim is not None
    attempt(report, "fail", lambda: claim.fail(ERROR))
    failed = Task.objects.get(key="job-fail")
    report["fail_status"], report["fail_stored"] = failed.status, failed.error

    # A queue worker whose name is beyond Latin-1.
    Task.objects.ensure("job-next", queue="default")
    claimed = attempt(report, "claim_next", lambda: Task.objects.claim_next(owner=OWNER, lease=30))
    report["claim_next"] = None if claimed is None else [c.key for c in claimed]
    queued = Task.objects.get(key="job-next")
    report["next_status"], report["next_owner"] = queued.status, queued.owner

    # A delivery id beyond Latin-1, on the attempt row.
    outcome = attempt(report, "delivery", lambda: Task.objects.claim("job-done", owner="w", delivery_id=DELIVERY))
    if outcome is not None and outcome.claim is not None:
        outcome.claim.complete({"message": ERROR})
        report["done_result"] = Task.objects.get(key="job-done").result
        report["delivery_stored"] = Attempt.objects.get(task__key="job-done").delivery_id
    emit(event="report", **report)


if __name__ == "__main__":
    main()
