"""Worker programs for the operator races: ``python -m tests.programs.ops MODE …``.

Claimers, drainers and operators (purge, cancel, the admin's cancel action) run side by side
as separate OS processes. Each prints one JSON line per event on stdout; an unexpected
exception is reported as an event (its type and text) so the test can count it, never hidden.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
import traceback
from collections import Counter
from typing import Any

from devtools.events import emit


def setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def error_name(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__name__}"


def wait_for_go() -> None:
    from django.db import connection

    connection.ensure_connection()
    emit(event="ready", pid=os.getpid())
    sys.stdin.readline()


def claimer(args: argparse.Namespace) -> None:
    """Claim keys ``k0..kN`` round robin; complete what it claims. Counts outcomes and errors."""
    from django_taskclaim.models import Task

    wait_for_go()
    me = f"claimer-{os.getpid()}"
    seen: Counter[str] = Counter()
    errors: list[dict[str, str]] = []
    invalid: list[str] = []
    deadline = time.monotonic() + args.seconds
    n = 0
    while time.monotonic() < deadline:
        key = f"k{n % args.keys}"
        n += 1
        try:
            if args.ensure:  # as enqueue_once does: the row first, in its own statement
                seen["ensured"] += Task.objects.ensure(key).key == key
            outcome = Task.objects.claim(key, owner=me, lease=30)
            if outcome.claimed:
                assert outcome.claim is not None
                outcome.claim.complete({"by": me})
                seen["claimed"] += 1
            else:
                status = outcome.task.status
                seen[status] += 1
                # A claim that lost sees the task running (another claimer holds it) or done.
                if status not in ("running", "succeeded") or (status == "succeeded" and outcome.task.result is None):
                    invalid.append(f"{key}: {status} result={outcome.task.result!r}")
        except Exception as exc:
            # Where in the app it was raised: the frames of django_taskclaim, outermost first.
            where = [f"{frame.filename.rsplit('/', 2)[-2]}/{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} "
                     f"{frame.name}" for frame in traceback.extract_tb(exc.__traceback__)
                     if "/django_taskclaim/" in frame.filename]
            errors.append({"type": error_name(exc), "text": str(exc)[:300], "where": where})
    emit(event="exit", counts=dict(seen), errors=errors, invalid=invalid)


def drain(args: argparse.Namespace) -> None:
    """Queue workers: claim_next + fenced() until the deadline (or no work is left)."""
    from django.db import DatabaseError

    from django_taskclaim.exceptions import StaleClaim
    from django_taskclaim.models import Task
    from tests.testapp.models import Effect

    wait_for_go()
    me = f"drain-{os.getpid()}"
    done = stale = 0
    errors: list[dict[str, str]] = []
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        try:
            claims = Task.objects.claim_next(owner=me, lease=args.lease)
            if not claims:
                if args.until_empty and not Task.objects.unfinished().exists():
                    break
                time.sleep(0.01)
                continue
            for claim in claims:
                try:
                    with claim.fenced():
                        Effect.objects.create(task_key=claim.key, token=claim.token, worker=me)
                        if args.work_ms:
                            time.sleep(args.work_ms / 1000)  # work done while holding the lock
                        claim.complete({"by": me})
                    done += 1
                except StaleClaim:
                    stale += 1
        except DatabaseError as exc:
            errors.append({"type": error_name(exc), "text": str(exc)[:300]})
    emit(event="exit", done=done, stale=stale, errors=errors)


def operator(args: argparse.Namespace) -> None:
    """Run an operator action in a loop: ``purge``, ``cancel`` (QuerySet.cancel) or ``admin-cancel``."""
    from django.core.management import call_command

    from django_taskclaim.models import Task

    wait_for_go()
    runs = changed = 0
    errors: list[dict[str, str]] = []
    client = admin_client() if args.action == "admin-cancel" else None
    deadline = time.monotonic() + args.seconds
    # At least --min-runs rounds (a starved SQLite writer may wait long for its turn), and
    # more until --seconds have passed.
    while runs < args.min_runs or time.monotonic() < deadline:
        try:
            if args.action == "purge":
                if args.backdate:
                    # Age the finished tasks as if time had passed, so the purge finds work
                    # while the claimers are still hammering the same keys.
                    Task.objects.finished().update(updated_at="2000-01-01T00:00:00Z")
                call_command("taskclaim_purge", "--older-than", "1s", "--status", *args.status,
                             stdout=io.StringIO())
            elif args.action == "cancel":
                ids = list(Task.objects.filter(key__startswith=args.prefix).unfinished()
                           .order_by("?").values_list("pk", flat=True)[:5])
                changed += Task.objects.filter(pk__in=ids).cancel()
            else:
                assert client is not None
                ids = list(Task.objects.filter(key__startswith=args.prefix).unfinished()
                           .order_by("?").values_list("pk", flat=True)[:5])
                response = client.post("/admin/django_taskclaim/task/", {
                    "action": "cancel", "_selected_action": ids, "index": 0})
                if response.status_code != 302:
                    raise RuntimeError(f"admin action answered {response.status_code}")
                changed += Task.objects.filter(pk__in=ids, status="cancelled").count()
            runs += 1
        except Exception as exc:
            errors.append({"type": error_name(exc), "text": str(exc)[:300],
                           "where": traceback.format_exc(limit=-2)[-600:]})
        time.sleep(args.pause)
    emit(event="exit", runs=runs, changed=changed, errors=errors)


def second_db(args: argparse.Namespace) -> None:
    """With ``TASKCLAIM_DATABASE = "tasks"`` (tests.settings_ops): build a history there, then
    report what the audit, inspect, purge, reclaim, the admin and the metrics see."""
    import datetime as dt

    from django.core.management import call_command
    from django.utils import timezone
    from prometheus_client import CollectorRegistry

    from django_taskclaim import metrics
    from django_taskclaim.conf import settings
    from django_taskclaim.models import Attempt, Task

    assert settings.DATABASE == "tasks"
    call_command("migrate", database="tasks", verbosity=0)
    # The history, written with explicit aliases so that it does not depend on the code under test.
    tasks = Task.objects.db_manager("tasks")
    twice = tasks.ensure("ran-twice")
    start = timezone.now() - dt.timedelta(minutes=5)
    Attempt.objects.using("tasks").create(task=twice, token=1, owner="ghost-a", started_at=start,
                                          ended_at=start + dt.timedelta(seconds=10), outcome="succeeded")
    Attempt.objects.using("tasks").create(task=twice, token=2, owner="ghost-b",
                                          started_at=start + dt.timedelta(seconds=5),
                                          ended_at=start + dt.timedelta(seconds=20), outcome="succeeded")
    held = tasks.claim("held", owner="w1", lease=600).claim
    assert held is not None
    tasks.filter(pk=held.task_id).update(lease_expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    done = tasks.claim("old-done", owner="w2").claim
    assert done is not None
    done.complete({"ok": True})
    tasks.filter(key="old-done").update(updated_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))

    def command(*argv: str) -> dict[str, Any]:
        out = io.StringIO()
        try:
            call_command(*argv, "--json", stdout=out, stderr=io.StringIO())
            code = 0
        except Exception as exc:
            code = getattr(exc, "returncode", -1)
        return {"code": code, "doc": json.loads(out.getvalue().splitlines()[0] if argv[0] != "taskclaim_audit"
                                                and argv[0] != "taskclaim_inspect" else out.getvalue())}

    report: dict[str, Any] = {}
    report["audit"] = command("taskclaim_audit")
    report["inspect"] = command("taskclaim_inspect", "ran-twice")
    report["reclaim"] = command("taskclaim_reclaim", "--dry-run")
    report["purge"] = command("taskclaim_purge", "--older-than", "1d", "--dry-run")
    client = admin_client()
    page = client.get(f"/admin/django_taskclaim/task/{twice.pk}/change/")
    report["admin_change"] = {"status": page.status_code, "ghost-a": "ghost-a" in page.content.decode()}
    page = client.get("/admin/django_taskclaim/task/")
    report["admin_list"] = {"status": page.status_code, "held": "held" in page.content.decode()}
    registry = CollectorRegistry()
    metrics.install(registry)
    db = {"database": "tasks"}  # TASKCLAIM_DATABASE of tests.settings_ops
    report["metrics"] = {"running": registry.get_sample_value("taskclaim_tasks", {"status": "running", **db}),
                         "expired": registry.get_sample_value("taskclaim_expired_leases", db)}
    report["default_db_tasks"] = Task.objects.using("default").count()
    emit(event="report", **report)


def admin_client() -> Any:
    """A test client logged in as a superuser (created here if absent)."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(
        username="ops-admin", defaults={"is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(user)
    return client


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("claimer")
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--keys", type=int, default=10)
    p.add_argument("--ensure", action="store_true", help="ensure() each key before claiming it")
    p = sub.add_parser("drain")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--lease", type=float, default=60)
    p.add_argument("--work-ms", type=float, default=0)
    p.add_argument("--until-empty", action="store_true")
    p = sub.add_parser("operator")
    p.add_argument("action", choices=("purge", "cancel", "admin-cancel"))
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--min-runs", type=int, default=0)
    p.add_argument("--prefix", default="")
    p.add_argument("--backdate", action="store_true")
    p.add_argument("--status", nargs="+", default=["succeeded", "failed", "cancelled"])
    sub.add_parser("second-db")
    args = parser.parse_args()
    setup()
    {"claimer": claimer, "drain": drain, "operator": operator, "second-db": second_db}[args.mode](args)


if __name__ == "__main__":
    main()
