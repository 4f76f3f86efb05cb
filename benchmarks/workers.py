"""Worker processes and the fork/barrier harness that times them.

Every measured loop runs in its own OS process (forked from the driver after Django is set
up and every database connection is closed), waits on a barrier with the driver, runs, and
sends its figures back on a queue. Times are ``time.perf_counter()`` (CLOCK_MONOTONIC on
Linux, the same clock in every process), so the driver can take the span from the first
start to the last end across processes.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import queue as queue_module
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

CTX = multiprocessing.get_context("fork")
BARRIER_TIMEOUT = 300.0

# ``Claim.complete()`` with no result sends this SET list: the raw phase passes the same
# fragment to the backend, and ``check_identical_sql`` proves both send identical SQL.
LEASE = 30.0
MAX_ATTEMPTS = 5
#: The queue the drain's tasks wait in, and the app's workers claim from by default (work for a handler).
QUEUES = ["default"]


def run_workers(
    target: Callable[..., Any], count: int, args: tuple[Any, ...],
    progress: Callable[[], None] | None = None, progress_every: float = 10.0,
) -> list[Any]:
    """Fork ``count`` workers running ``target(index, barrier, *args)``; their results in order."""
    from django.db import connections

    connections.close_all()  # never share a socket with a child
    barrier = CTX.Barrier(count + 1)
    results: CTX.Queue = CTX.Queue()  # type: ignore[name-defined]
    procs = [CTX.Process(target=_child, args=(target, i, barrier, results, args), daemon=True)
             for i in range(count)]
    for proc in procs:
        proc.start()
    out: dict[int, Any] = {}
    errors: list[str] = []
    try:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(BARRIER_TIMEOUT)  # broken when a child failed: its traceback is queued
        last = time.monotonic()
        while len(out) + len(errors) < count:
            try:
                status, index, value = results.get(timeout=1.0)
            except queue_module.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"worker exited with code {dead[0].exitcode} without a report") from None
                if progress is not None and time.monotonic() - last >= progress_every:
                    last = time.monotonic()
                    progress()
                continue
            if status == "ok":
                out[index] = value
            else:
                errors.append(value)
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    if errors:
        raise RuntimeError("a benchmark worker failed:\n" + errors[0])
    return [out[i] for i in range(count)]


def _child(target: Callable[..., Any], index: int, barrier: Any, results: Any, args: tuple[Any, ...]) -> None:
    from django.db import connections

    try:
        value = target(index, barrier, *args)
    except BaseException:
        barrier.abort()
        results.put(("error", index, traceback.format_exc()))
    else:
        results.put(("ok", index, value))
    finally:
        connections.close_all()


def _audit(audit: bool) -> None:
    from django.test import override_settings

    override_settings(TASKCLAIM_AUDIT=audit).enable()  # this process only


# -- by-key claim + complete ---------------------------------------------------------------

def bykey_app(index: int, barrier: Any, run: str, duration: float, audit: bool) -> dict[str, Any]:
    from django_taskclaim.models import Task

    _audit(audit)
    owner = f"bench-app-{index}"

    def cycle(key: str) -> None:
        outcome = Task.objects.claim(key, owner=owner, lease=LEASE)
        assert outcome.claim is not None, key
        outcome.claim.complete()

    for n in range(20):
        cycle(f"{run}:warm:{index}:{n}")
    barrier.wait(BARRIER_TIMEOUT)
    start = time.perf_counter()
    end, n = start + duration, 0
    while time.perf_counter() < end:
        cycle(f"{run}:{index}:{n}")
        n += 1
    return {"count": n, "start": start, "end": time.perf_counter()}


def raw_cycle(cursor: Any, key: str, owner: str, audit: bool) -> None:
    """One claim + complete through the app's PostgreSQL backend methods on a plain cursor."""
    from django_taskclaim.store.postgresql import store as pg
    from django_taskclaim.store.rows import Claimed

    claimed = pg.claim_key(cursor, tenant="", key=key, owner=owner, lease=LEASE, payload=None,
                           fingerprint="", max_attempts=MAX_ATTEMPTS, delivery_id="", audit=audit)
    assert isinstance(claimed, Claimed), key
    status = pg.complete(cursor, claimed.row.id, claimed.row.fencing_token, None, "", audit)
    assert status == "succeeded", key


def bykey_raw(index: int, barrier: Any, run: str, duration: float, audit: bool, url: str) -> dict[str, Any]:
    import psycopg

    owner = f"bench-raw-{index}"
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
        for n in range(20):
            raw_cycle(cursor, f"{run}:warm:{index}:{n}", owner, audit)
        barrier.wait(BARRIER_TIMEOUT)
        start = time.perf_counter()
        end, n = start + duration, 0
        while time.perf_counter() < end:
            raw_cycle(cursor, f"{run}:{index}:{n}", owner, audit)
            n += 1
        return {"count": n, "start": start, "end": time.perf_counter()}


# The simplest correct claim a user would hand-write: one upsert that takes a fresh or
# claimable row (pending, or running with an expired lease) and bumps its fencing token, then
# a completion fenced by (id, token). Autocommit: one commit per statement, no audit rows.
MINIMAL_CLAIM_SQL = (
    'INSERT INTO django_taskclaim_task AS t (tenant, "key", status, owner, fencing_token, attempts, '
    "max_attempts, lease_expires_at, payload_fingerprint, result_ref, error, created_at, updated_at, priority, "
    "task_path) VALUES (%s, %s, 'running', %s, 1, 1, %s, now() + make_interval(secs => %s), '', '', '', now(), "
    "now(), 0, '') "
    'ON CONFLICT (tenant, "key") DO UPDATE SET status = \'running\', owner = EXCLUDED.owner, '
    "fencing_token = t.fencing_token + 1, attempts = t.attempts + 1, "
    "lease_expires_at = EXCLUDED.lease_expires_at, updated_at = now() "
    "WHERE t.status = 'pending' OR (t.status = 'running' AND t.lease_expires_at < now()) "
    "RETURNING id, fencing_token"
)
MINIMAL_COMPLETE_SQL = (
    "UPDATE django_taskclaim_task SET status = 'succeeded', result = NULL, updated_at = now() "
    "WHERE id = %s AND fencing_token = %s AND status = 'running'"
)


def minimal_cycle(cursor: Any, key: str, owner: str) -> None:
    cursor.execute(MINIMAL_CLAIM_SQL, ("", key, owner, MAX_ATTEMPTS, LEASE))
    row = cursor.fetchone()
    assert row is not None, key
    cursor.execute(MINIMAL_COMPLETE_SQL, row)
    assert cursor.rowcount == 1, key


def bykey_minimal(index: int, barrier: Any, run: str, duration: float, url: str) -> dict[str, Any]:
    """By-key claim + complete with the minimal hand-written SQL above, plain psycopg."""
    import psycopg

    owner = f"bench-min-{index}"
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
        for n in range(20):
            minimal_cycle(cursor, f"{run}:warm:{index}:{n}", owner)
        barrier.wait(BARRIER_TIMEOUT)
        start = time.perf_counter()
        end, n = start + duration, 0
        while time.perf_counter() < end:
            minimal_cycle(cursor, f"{run}:{index}:{n}", owner)
            n += 1
        return {"count": n, "start": start, "end": time.perf_counter()}


def check_identical_sql(url: str) -> int:
    """Prove that the raw phase sends the very statements the app sends; returns how many."""
    import psycopg
    from django.db import connection

    from django_taskclaim.models import Task

    class Recording:
        def __init__(self, cursor: Any, log: list[str]) -> None:
            self.cursor, self.log = cursor, log

        def execute(self, sql: str, params: Any = None) -> Any:
            self.log.append(sql)
            return self.cursor.execute(sql, params)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.cursor, name)

    from django.test import override_settings

    from django_taskclaim.store import prepared

    checked = 0
    # Which claim statement is sent follows what the session's last claim met (its claim hint):
    # each side starts from the same hint, and the fresh keys of the by-key loops send the insert alone.
    for audit, kind in itertools.product((True, False), ("insert", "lean")):
        app_sql: list[str] = []
        with connection.cursor() as cursor:
            prepared.set_claim_hint(cursor, kind)

        def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any,
                    log: list[str] = app_sql) -> Any:
            log.append(sql)
            return execute(sql, params, many, context)

        with override_settings(TASKCLAIM_AUDIT=audit), connection.execute_wrapper(wrapper):
            outcome = Task.objects.claim(f"sqlcheck:app:{audit}:{kind}", owner="sqlcheck", lease=LEASE)
            assert outcome.claim is not None
            outcome.claim.complete()
        raw_sql: list[str] = []
        with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
            prepared.set_claim_hint(cursor, kind)
            raw_cycle(Recording(cursor, raw_sql), f"sqlcheck:raw:{audit}:{kind}", "sqlcheck", audit)
        # Both bind on the server; the app prepares its statements at once, psycopg the raw ones
        # after 5 runs. The statements' text is what must match.
        if app_sql != raw_sql:
            raise RuntimeError(
                f"the raw phase no longer sends the app's SQL (audit={audit}, {kind}):\n"
                f"app: {app_sql}\nraw: {raw_sql}"
            )
        checked += len(app_sql)
    return checked


# -- queue drain ------------------------------------------------------------------------------

def drain_app(index: int, barrier: Any, audit: bool) -> dict[str, Any]:
    from django.db import connection

    from django_taskclaim.models import Task

    _audit(audit)
    owner = f"bench-drain-{index}"
    connection.ensure_connection()
    barrier.wait(BARRIER_TIMEOUT)
    start = time.perf_counter()
    executed: list[int] = []
    # The queue worker's loop: the completion of a task claims the next (one commit per task).
    claims = Task.objects.claim_next(owner=owner, lease=LEASE)
    while claims:
        claim = claims[0]
        executed.append(claim.task_id)  # the no-op "execution"
        claims = claim.complete_and_claim_next()
    return {"executed": executed, "start": start, "end": time.perf_counter()}


def drain_worker(index: int, barrier: Any, batch: int) -> dict[str, Any]:
    """The worker helper as users run it: ``work(handler, batch=…)``, each task under
    ``keepalive()``, ``batch`` claimed at a time, the last completion of a batch claiming the next."""
    from django.db import connection

    from django_taskclaim.worker import work

    executed: list[int] = []
    connection.ensure_connection()
    barrier.wait(BARRIER_TIMEOUT)
    start = time.perf_counter()
    # poll: a worker that finds the queue empty while others still hold tasks looks again soon.
    work(lambda claim: executed.append(claim.task_id), owner=f"bench-worker-{index}", lease=LEASE,
         batch=batch, until_drained=True, poll=0.01)
    return {"executed": executed, "start": start, "end": time.perf_counter()}


def drain_raw(index: int, barrier: Any, audit: bool, url: str, batch: int = 1) -> dict[str, Any]:
    """The commit limit: the very statements of the app's loop, sent by psycopg in autocommit
    (one commit per task), with none of the app's Python around it. With ``batch`` k, as the
    worker: k claimed at a time, k - 1 plain completions, the last one claiming the next k."""
    import psycopg

    from django_taskclaim.store.postgresql import store as pg

    owner = f"bench-drain-raw-{index}"
    executed: list[int] = []
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT 1")
        barrier.wait(BARRIER_TIMEOUT)
        start = time.perf_counter()
        claimed, _ = pg.claim_next(cursor, owner=owner, lease=LEASE, tenant=None, limit=batch, delivery_id="",
                                   audit=audit, queues=QUEUES, path="")
        while claimed:
            *first, last = (c.row for c in claimed)
            for row in first:
                executed.append(row.id)
                assert pg.complete(cursor, row.id, row.fencing_token, None, "", audit) == "succeeded", row
            executed.append(last.id)
            status, claimed, _ = pg.complete_and_claim_next(
                cursor, last.id, last.fencing_token, None, "", owner=owner, lease=LEASE, tenant=None,
                limit=batch, delivery_id="", audit=audit, queues=QUEUES, path="")
            assert status == "succeeded", last
    return {"executed": executed, "start": start, "end": time.perf_counter()}


# -- latency by table size and under contention ----------------------------------------------

def latency(index: int, barrier: Any, run: str, samples: int, queues: list[str]) -> dict[str, Any]:
    """``samples`` by-key claims of fresh keys, then ``samples`` ``claim_next()`` on one queue at a time
    (each of ``queues`` in turn), then ``samples`` on all of them at once; each claim timed, then completed."""
    from django_taskclaim.models import Task

    owner = f"bench-lat-{index}"
    for n in range(20):
        Task.objects.claim(f"{run}:warm:{n}", owner=owner, lease=LEASE).claim.complete()  # type: ignore[union-attr]
    barrier.wait(BARRIER_TIMEOUT)
    bykey, queue, several = [], [], []
    for n in range(samples):
        t0 = time.perf_counter()
        outcome = Task.objects.claim(f"{run}:{n}", owner=owner, lease=LEASE)
        bykey.append(time.perf_counter() - t0)
        outcome.claim.complete()  # type: ignore[union-attr]
    for times, of in ((queue, lambda n: queues[n % len(queues)]), (several, lambda n: queues)):
        for n in range(samples):
            t0 = time.perf_counter()
            claims = Task.objects.claim_next(owner=owner, lease=LEASE, queue=of(n))
            times.append(time.perf_counter() - t0)
            assert len(claims) == 1, of(n)
            claims[0].complete()
    return {"bykey": bykey, "queue": queue, "queues": several}


def race(index: int, barrier: Any, run: str, keys: int, rounds: Any) -> dict[str, Any]:
    """Claim key 0, 1, … in lockstep with the other racers; one decision latency per key."""
    from django.db import connection

    from django_taskclaim.models import Task

    owner = f"bench-race-{index}"
    connection.ensure_connection()
    Task.objects.filter(pk=-1).exists()  # warm the ORM path
    barrier.wait(BARRIER_TIMEOUT)
    times, won = [], []
    for k in range(keys):
        rounds.wait(BARRIER_TIMEOUT)
        t0 = time.perf_counter()
        outcome = Task.objects.claim(f"{run}:{k}", owner=owner, lease=300)
        times.append(time.perf_counter() - t0)
        if outcome.claimed:
            won.append(k)
    return {"times": times, "won": won}


def race_raw(index: int, barrier: Any, run: str, keys: int, rounds: Any, url: str) -> dict[str, Any]:
    """The same race with plain psycopg and the claim statement alone: the floor this machine sets.

    No state read and no ``duplicate`` record for losers, no ORM: what is left is the database's
    own serialisation of racing writers and the CPU scheduling of the racing processes.
    """
    import psycopg

    from django_taskclaim.store.postgresql import store as pg
    from django_taskclaim.store.rows import Claimed

    owner = f"bench-raw-race-{index}"
    times, won = [], []
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT 1")
        barrier.wait(BARRIER_TIMEOUT)
        for k in range(keys):
            rounds.wait(BARRIER_TIMEOUT)
            t0 = time.perf_counter()
            claimed = pg.claim_key(cursor, tenant="", key=f"{run}:{k}", owner=owner, lease=300, payload=None,
                                   fingerprint="", max_attempts=MAX_ATTEMPTS, delivery_id="", audit=True)
            times.append(time.perf_counter() - t0)
            if isinstance(claimed, Claimed):
                won.append(k)
    return {"times": times, "won": won}
