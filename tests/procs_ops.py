"""Worker programs for the operator races: ``python -m tests.procs_ops MODE …``.

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


def setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def emit(**event: object) -> None:
    print(json.dumps(event), flush=True)


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
            errors.append({"type": error_name(exc), "text": str(exc)[:300]})
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
    while time.monotonic() < deadline:
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
    p = sub.add_parser("drain")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--lease", type=float, default=60)
    p.add_argument("--work-ms", type=float, default=0)
    p.add_argument("--until-empty", action="store_true")
    p = sub.add_parser("operator")
    p.add_argument("action", choices=("purge", "cancel", "admin-cancel"))
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--prefix", default="")
    p.add_argument("--backdate", action="store_true")
    p.add_argument("--status", nargs="+", default=["succeeded", "failed", "cancelled"])
    args = parser.parse_args()
    setup()
    {"claimer": claimer, "drain": drain, "operator": operator}[args.mode](args)


if __name__ == "__main__":
    main()
