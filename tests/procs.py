"""Worker programs run as separate OS processes by the tests: ``python -m tests.procs MODE …``.

Each prints one JSON line per event on stdout so the test can follow it without sleeping.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    if os.environ.get("TASKCLAIM_TEST_CONFIG") == "autocommit_off":
        from django.db import connections, transaction

        for alias in connections:
            transaction.set_autocommit(False, using=alias)


def end_unit() -> None:
    """End one unit of work as the configuration's callers do (tests/configurations.py).

    Autocommit off: the caller commits what it did. A connection pool: the connection goes back
    to the pool, as at the end of a request, so the next unit may run on another session.
    """
    from django.conf import settings
    from django.db import connections, transaction

    config = os.environ.get("TASKCLAIM_TEST_CONFIG")
    if config == "autocommit_off":
        for alias in connections:
            transaction.commit(using=alias)
    elif config == "pool":
        for alias in settings.DATABASES:
            connections[alias].close()


def emit(**event: object) -> None:
    print(json.dumps(event), flush=True)


def race(args: argparse.Namespace) -> None:
    """Connect, say ready, wait for 'go' on stdin, then claim one key once."""
    from django.db import connections

    from django_taskclaim.conf import settings
    from django_taskclaim.models import Task

    db = connections[settings.DATABASE]
    db.ensure_connection()
    emit(event="ready", pid=os.getpid(), autocommit=db.get_autocommit())
    sys.stdin.readline()
    outcome = Task.objects.claim(args.key, lease=args.lease, owner=f"racer-{os.getpid()}")
    end_unit()
    emit(event="done", claimed=outcome.claimed, token=outcome.task.fencing_token,
         status=outcome.task.status, owner=outcome.task.owner)


def request(args: argparse.Namespace) -> None:
    """Connect, say ready, wait for 'go', then POST ``args.path`` through Django's whole handler.

    The test client runs the request as a server would (middleware, ATOMIC_REQUESTS, the
    request_finished signal that ends the connection); the response is reported.
    """
    from django.db import connections
    from django.test import Client

    from django_taskclaim.conf import settings

    connections[settings.DATABASE].ensure_connection()
    emit(event="ready", pid=os.getpid())
    sys.stdin.readline()
    response = Client().post(args.path)
    end_unit()
    emit(event="response", status=response.status_code, body=response.json())


def drain(args: argparse.Namespace) -> None:
    """Claim tasks queue-style until none is unfinished; each effect written inside fenced()."""
    from django_taskclaim.exceptions import StaleClaim
    from django_taskclaim.models import Task
    from tests.testapp.models import Effect

    me = f"{args.tag}-{os.getpid()}"
    done = stale = 0
    emit(event="ready", pid=os.getpid())
    while True:
        claims = Task.objects.claim_next(owner=me, lease=args.lease, limit=args.batch)
        end_unit()
        if not claims:
            if not Task.objects.unfinished().exists():
                break
            time.sleep(0.02)  # idle poll: tasks exist but are held under live leases
            continue
        for claim in claims:
            emit(event="claimed", key=claim.key, token=claim.token)
            if args.work_ms:
                time.sleep(args.work_ms / 1000)  # simulated work, the window pauses land in
            try:
                with claim.fenced():
                    Effect.objects.create(task_key=claim.key, token=claim.token, worker=me)
                    claim.complete({"by": me, "token": claim.token})
                done += 1
            except StaleClaim:
                stale += 1
                emit(event="stale", key=claim.key, token=claim.token)
            end_unit()
    emit(event="exit", done=done, stale=stale)


def cycles(args: argparse.Namespace) -> None:
    """Claim and complete ``--n`` keys, ending each cycle like a request; report what failed.

    Each cycle is claim, complete, ``end_unit()``, then ``connection.close()`` as at the end
    of a request (with a pool: back to the pool). Errors are counted, not raised, so that the
    test sees how many cycles a configuration breaks.
    """
    from django.db import DatabaseError, connections

    from django_taskclaim.models import Task

    ok, errors = 0, []
    for i in range(args.n):
        try:
            outcome = Task.objects.claim(f"{args.prefix}-{i}", owner=f"cycles-{os.getpid()}")
            assert outcome.claim is not None
            outcome.claim.complete({"i": i})
            ok += 1
        except DatabaseError as exc:
            errors.append(f"{type(exc).__name__}: {exc}".splitlines()[0])
        end_unit()
        connections.close_all()
    emit(event="exit", ok=ok, failed=len(errors), errors=errors[:5])


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("race")
    p.add_argument("key")
    p.add_argument("--lease", type=float, default=30)
    p = sub.add_parser("drain")
    p.add_argument("--lease", type=float, default=30)
    p.add_argument("--work-ms", type=float, default=0)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tag", default="w")
    p = sub.add_parser("request")
    p.add_argument("path")
    p = sub.add_parser("cycles")
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--prefix", default="cycle")
    args = parser.parse_args()
    setup()
    {"race": race, "drain": drain, "cycles": cycles, "request": request}[args.mode](args)


if __name__ == "__main__":
    main()
