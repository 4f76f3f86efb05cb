"""Worker programs run as separate OS processes by the tests: ``python -m tests.programs.claimer MODE …``.

Each prints one JSON line per event on stdout so the test can follow it without sleeping.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from devtools.events import emit


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


def race_next(args: argparse.Namespace) -> None:
    """Connect, say ready, wait for 'go', then make one queue claim (``--batch`` tasks at most) and
    hold what it got: the keys claimed are reported, nothing is completed."""
    from django.db import connections

    from django_taskclaim.conf import settings
    from django_taskclaim.models import Task

    connections[settings.DATABASE].ensure_connection()
    emit(event="ready", pid=os.getpid())
    sys.stdin.readline()
    claims = Task.objects.claim_next(owner=f"racer-{os.getpid()}", lease=args.lease, limit=args.batch)
    end_unit()
    emit(event="done", keys=[c.key for c in claims])


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
    if args.go:
        sys.stdin.readline()  # start together with the others: the first claims race
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


def clock(args: argparse.Namespace) -> None:
    """Lease decisions of a process whose clock may be faked: one JSON report of what it saw."""
    from django_taskclaim.models import Task

    me = f"faked-{os.getpid()}"
    report: dict[str, object] = {"process_clock": time.time()}
    report["live"] = sorted(Task.objects.live().values_list("key", flat=True))
    report["expired"] = sorted(Task.objects.expired().values_list("key", flat=True))
    report["claim_live"] = Task.objects.claim("key-live", owner=me, lease=30).claimed
    report["claim_gone"] = Task.objects.claim("key-gone", owner=me, lease=30).claimed
    report["claim_next"] = [c.key for c in Task.objects.claim_next(owner=me, lease=30, limit=10)]
    report["reclaimed"] = Task.objects.reclaim_expired()
    emit(**report)


def fenced_owner(args: argparse.Namespace) -> None:
    """Claim, enter ``fenced()``, say so, and wait for a line on stdin before writing and committing."""
    from django_taskclaim.exceptions import StaleClaim
    from django_taskclaim.models import Task
    from tests.testapp.models import Effect

    me = f"owner-{os.getpid()}"
    claim = Task.objects.claim(args.key, owner=me, lease=args.lease).claim
    assert claim is not None
    try:
        with claim.fenced():
            emit(event="inside", token=claim.token)
            sys.stdin.readline()  # held here, after the token check and before the commit
            Effect.objects.create(task_key=claim.key, token=claim.token, worker=me)
            claim.complete({"by": me})
        emit(event="committed", token=claim.token)
    except StaleClaim:
        emit(event="stale", token=claim.token)


def outbox_owner(args: argparse.Namespace) -> None:
    """Claim, say so, wait for a line on stdin (the test pauses the process meanwhile), then record
    an outbox message to ``--url`` with the completion inside ``fenced()``."""
    from django_taskclaim.exceptions import StaleClaim
    from django_taskclaim.models import Task

    claim = Task.objects.claim(args.key, owner=f"owner-{os.getpid()}", lease=args.lease).claim
    assert claim is not None
    emit(event="claimed", token=claim.token)
    sys.stdin.readline()
    try:
        with claim.fenced():
            message = claim.outbox.http("POST", args.url, json={"by": os.getpid()}, effect="publish")
            claim.complete({"message": message})
        emit(event="committed", token=claim.token, message=message)
    except StaleClaim:
        emit(event="stale", token=claim.token)


def _lock_wait(seconds: float) -> None:
    """How long this connection waits for a lock held by another (a row lock, SQLite's write lock)."""
    from django.db import connection

    from django_taskclaim.store import get_store

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # For this whole session (the store's limit is transaction-local, for the keepalive).
            cursor.execute("SELECT set_config('lock_timeout', %s, false)", [f"{int(seconds * 1000)}ms"])
        else:  # the session's own setting on SQLite and MySQL
            get_store("default").limit_lock_waits(cursor, seconds)


def taker(args: argparse.Namespace) -> None:
    """Claim a key whose lease expired: first with a short lock wait, to tell whether someone holds
    the row (``blocked``), then waiting as long as it takes; do the effect inside ``fenced()``."""
    from django.db import OperationalError

    from django_taskclaim.models import Task
    from tests.testapp.models import Effect

    me = f"taker-{os.getpid()}"
    _lock_wait(0.3)
    try:
        outcome = Task.objects.claim(args.key, owner=me, lease=args.lease)
    except OperationalError as exc:  # the lock is held: wait for it now
        emit(event="blocked", error=str(exc)[:200])
        _lock_wait(120)
        outcome = Task.objects.claim(args.key, owner=me, lease=args.lease)
    if outcome.claim is not None:
        claim = outcome.claim
        with claim.fenced():
            Effect.objects.create(task_key=claim.key, token=claim.token, worker=me)
            claim.complete({"by": me})
    emit(event="done", claimed=outcome.claimed, token=outcome.task.fencing_token, status=outcome.task.status)


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
    sub.add_parser("clock")
    for mode in ("fenced-owner", "taker"):
        p = sub.add_parser(mode)
        p.add_argument("key")
        p.add_argument("--lease", type=float, default=30)
    p = sub.add_parser("outbox-owner")
    p.add_argument("key")
    p.add_argument("--lease", type=float, default=30)
    p.add_argument("--url", required=True)
    p = sub.add_parser("drain")
    p.add_argument("--lease", type=float, default=30)
    p.add_argument("--work-ms", type=float, default=0)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tag", default="w")
    p.add_argument("--go", action="store_true", help="wait for a line on stdin after 'ready'")
    p = sub.add_parser("race-next")
    p.add_argument("--lease", type=float, default=30)
    p.add_argument("--batch", type=int, default=1)
    p = sub.add_parser("request")
    p.add_argument("path")
    p = sub.add_parser("cycles")
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--prefix", default="cycle")
    args = parser.parse_args()
    setup()
    {"race": race, "drain": drain, "clock": clock, "fenced-owner": fenced_owner, "taker": taker,
     "cycles": cycles, "request": request, "race-next": race_next,
     "outbox-owner": outbox_owner}[args.mode](args)


if __name__ == "__main__":
    main()
