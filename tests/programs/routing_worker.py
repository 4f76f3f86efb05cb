"""Worker programs of the sharded configurations, run as OS processes by
tests/processes/test_sharded_processes.py: ``python -m tests.programs.routing_worker MODE …``. Each
prints one JSON line per event on stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

from devtools.events import emit

#: The advisory lock a ``wait-*`` task of ``serve`` waits for (the test holds it).
WAIT_LOCK = 73021


def setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def fenced_effect(claim: object) -> None:
    """The task's effect, committed with its completion on the claim's database."""
    from tests.testapp.models import Effect

    with claim.fenced():  # type: ignore[attr-defined]
        Effect.objects.create(task_key=f"{claim.tenant}/{claim.key}", token=claim.token,  # type: ignore[attr-defined]
                              worker=str(os.getpid()))
        claim.complete({"by": os.getpid()})  # type: ignore[attr-defined]


def race(args: argparse.Namespace) -> None:
    """Connect to every task database, say ready, wait for 'go', then claim each KEY@TENANT in turn;
    the effect of each one won is written inside fenced()."""
    from django.db import connections

    from django_taskclaim.models import Task
    from django_taskclaim.routing import databases

    for alias in databases():
        connections[alias].ensure_connection()
    emit(event="ready", pid=os.getpid())
    sys.stdin.readline()
    won = []
    for item in args.items:
        key, tenant = item.split("@")
        outcome = Task.objects.claim(key, tenant=tenant, owner=f"racer-{os.getpid()}", lease=60)
        if outcome.claim is not None:
            fenced_effect(outcome.claim)
            won.append({"key": key, "tenant": tenant, "database": outcome.claim.using})
    emit(event="done", won=won)


def hold(args: argparse.Namespace) -> None:
    """Claim KEY of TENANT with a short lease, say so, wait for a line on stdin (the test pauses this
    process past its lease meanwhile), then try to write the effect inside fenced()."""
    from django_taskclaim.exceptions import StaleClaim
    from django_taskclaim.models import Task

    claim = Task.objects.claim(args.key, tenant=args.tenant, owner=f"holder-{os.getpid()}", lease=args.lease).claim
    assert claim is not None
    emit(event="claimed", token=claim.token, database=claim.using)
    sys.stdin.readline()
    try:
        fenced_effect(claim)
    except StaleClaim:
        emit(event="stale", token=claim.token)
        return
    emit(event="committed", token=claim.token)


def serve(args: argparse.Namespace) -> None:
    """A queue worker over every task database (work() with no tenant) until stdin closes; one
    event per task done, with its database."""
    from django_taskclaim.worker import work

    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()  # returns at EOF: the test closed our stdin
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()

    def handle(claim: object) -> None:
        if claim.key.startswith("wait-"):  # type: ignore[attr-defined]
            # A statement in flight: it waits for the advisory lock the test holds on that database.
            from django.db import connections

            emit(event="waiting", key=claim.key, database=claim.using)  # type: ignore[attr-defined]
            with connections[claim.using].cursor() as cursor:  # type: ignore[attr-defined]
                cursor.execute("SELECT pg_advisory_lock(%s)", [WAIT_LOCK])
                cursor.execute("SELECT pg_advisory_unlock(%s)", [WAIT_LOCK])
        fenced_effect(claim)
        emit(event="done", key=claim.key, tenant=claim.tenant, database=claim.using)  # type: ignore[attr-defined]

    emit(event="ready", pid=os.getpid())
    stats = work(handle, lease=args.lease, poll=0.05, stop=stop, until_drained=args.until_drained)
    emit(event="exit", succeeded=stats.succeeded, fenced_off=stats.fenced_off, failed=stats.failed,
         unrecorded=stats.unrecorded)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("race")
    p.add_argument("items", nargs="+", help="KEY@TENANT")
    p = sub.add_parser("hold")
    p.add_argument("key")
    p.add_argument("tenant")
    p.add_argument("--lease", type=float, default=1.0)
    p = sub.add_parser("serve")
    p.add_argument("--lease", type=float, default=30)
    p.add_argument("--until-drained", action="store_true")
    args = parser.parse_args()
    setup()
    {"race": race, "hold": hold, "serve": serve}[args.mode](args)


if __name__ == "__main__":
    main()
