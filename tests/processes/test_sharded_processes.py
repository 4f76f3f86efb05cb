"""Tenants over two task databases, proven with OS processes and a server stopped for real
(configurations ``sharded`` and ``sharded_mixed``; see tests/databases/test_sharded.py).

- racing processes on keys of tenants of both databases: one winner per key, each effect once,
  in the tenant's database;
- workers draining both databases at once: every task once, every effect once;
- a takeover in each database: owners paused past their lease (SIGSTOP) are fenced off there;
- the second server stopped (``pg_ctl stop``): the other tenants keep working (a worker keeps
  draining them, claims and the reclaim sweeper go on), the stopped database's calls fail naming
  it, and everything recovers when the server is started again;
- the second server hung (SIGSTOP of every process, or of the postmaster alone, a statement in
  flight on it): its kernel still acknowledges, no socket timeout fires, and still the worker
  runs every task of the other database at once, ``claim_next()`` skips the hung one after
  ``TASKCLAIM_DATABASE_TIMEOUT``, and after SIGCONT every task runs, once.
"""

from __future__ import annotations

import io
import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connections
from django.test import override_settings
from prometheus_client import CollectorRegistry

from devtools.polling import wait_until
from devtools.processes import Child, Supervisor
from devtools.servers import PostgresServer
from devtools.threads import call_in_thread
from django_taskclaim import metrics
from django_taskclaim.exceptions import DatabaseUnreachable
from django_taskclaim.models import Attempt, Task
from tests.programs.routing_worker import WAIT_LOCK
from tests.routers import tenant_database
from tests.sharding import ON_A, ON_B, SHARDED_TESTS, A, B
from tests.testapp.models import Effect

pytestmark = SHARDED_TESTS


@pytest.fixture
def procs(processes: Supervisor) -> Supervisor:
    return processes


def start(procs: Supervisor, *args: str) -> Child:
    return procs.start("tests.programs.routing_worker", *args)


def events(procs: Supervisor, predicate: Callable[[Child, dict[str, Any]], bool], count: int, *, timeout: float,
           what: str) -> list[dict[str, Any]]:
    """The first ``count`` events (of every child, read so far or to come) for which ``predicate`` holds.

    Events read while waiting for others stay in the log: several children report in any order.
    """
    deadline = time.monotonic() + timeout
    while True:
        found = [e for c, e in procs.log if predicate(c, e)]
        if len(found) >= count:
            return found[:count]
        if procs.next(deadline - time.monotonic()) is None and time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}: {len(found)} of {count}")


def event_of(procs: Supervisor, child: Child, name: str, timeout: float = 60) -> dict[str, Any]:
    return events(procs, lambda c, e: c is child and e.get("event") == name, 1, timeout=timeout,
                  what=f"{name!r} from process {child.pid}")[0]


def effects_by_task(alias: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in Effect.objects.using(alias).values_list("task_key", flat=True):
        counts[name] = counts.get(name, 0) + 1
    return counts


def test_racing_processes_one_winner_per_key_in_both_databases(procs: Supervisor) -> None:
    items = [f"order-{n}@{tenant}" for tenant in (ON_A[0], ON_B[0], ON_A[1], ON_B[1]) for n in range(5)]
    racers = [start(procs, "race", *items) for _ in range(5)]
    for racer in racers:
        event_of(procs, racer, "ready")
    for racer in racers:
        racer.send("go")
    won = [w for racer in racers for w in event_of(procs, racer, "done", 120)["won"]]
    for racer in racers:
        assert racer.wait(60) == 0, racer.stderr()
    assert sorted((w["tenant"], w["key"]) for w in won) == sorted(tuple(reversed(i.split("@"))) for i in items)
    assert all(w["database"] == tenant_database(w["tenant"]) for w in won)
    for alias, tenants in ((A, ON_A[:2]), (B, ON_B[:2])):
        assert effects_by_task(alias) == {f"{t}/order-{n}": 1 for t in tenants for n in range(5)}
        tasks = Task.objects.db_manager(alias)
        assert tasks.count() == 10 and set(tasks.values_list("status", flat=True)) == {"succeeded"}
        assert set(tasks.values_list("fencing_token", flat=True)) == {1}
        assert Attempt.objects.using(alias).filter(outcome="duplicate").count() <= 10 * 4


def test_workers_drain_both_databases_and_apply_every_effect_once(procs: Supervisor) -> None:
    for n in range(60):
        Task.objects.ensure(f"job-{n}", tenant=ON_A[n % 3], queue="default")
        Task.objects.ensure(f"job-{n}", tenant=ON_B[n % 3], queue="default")
    workers = [start(procs, "serve", "--until-drained") for _ in range(3)]
    exits = [event_of(procs, w, "exit", 180) for w in workers]
    for worker in workers:
        assert worker.wait(60) == 0, worker.stderr()
    assert sum(e["succeeded"] for e in exits) == 120 and not any(e["failed"] or e["unrecorded"] for e in exits)
    done = [e for _, e in procs.log if e.get("event") == "done"]
    assert all(e["database"] == tenant_database(e["tenant"]) for e in done)
    for alias, tenants in ((A, ON_A), (B, ON_B)):
        assert effects_by_task(alias) == {f"{tenants[n % 3]}/job-{n}": 1 for n in range(60)}
        assert set(Task.objects.db_manager(alias).values_list("status", flat=True)) == {"succeeded"}


def test_a_takeover_in_each_database_fences_off_the_paused_owner(procs: Supervisor) -> None:
    holders = {tenant: start(procs, "hold", "report", tenant, "--lease", "1") for tenant in (ON_A[0], ON_B[0])}
    try:
        for tenant, holder in holders.items():
            claimed = event_of(procs, holder, "claimed")
            assert claimed["database"] == tenant_database(tenant) and claimed["token"] == 1
            holder.stop()  # SIGSTOP: paused with its claim, past its lease
        for tenant in holders:
            taker = wait_until(lambda tenant=tenant: Task.objects.claim("report", tenant=tenant, owner="taker").claim,
                               timeout=30, what=f"a takeover of {tenant}'s task")
            assert taker.token == 2 and taker.using == tenant_database(tenant)
            with taker.fenced():
                Effect.objects.create(task_key=f"{tenant}/report", token=taker.token, worker="taker")
                taker.complete("taken over")
    finally:
        for holder in holders.values():
            holder.cont()  # never left stopped by a failure above
    for holder in holders.values():
        holder.send("write now")
        assert event_of(procs, holder, "stale")["token"] == 1
        assert holder.wait(60) == 0, holder.stderr()
    for tenant in holders:
        alias = tenant_database(tenant)
        assert list(Effect.objects.using(alias).values_list("task_key", "worker")) == [(f"{tenant}/report", "taker")]
        outcomes = dict(Attempt.objects.using(alias).filter(token__isnull=False).values_list("token", "outcome"))
        assert outcomes == {1: "taken_over", 2: "succeeded"}
        assert Attempt.objects.using(alias).get(token=1).stale_writes == 1


# ---- one server stopped --------------------------------------------------------------------

def done_events(procs: Supervisor, database: str, count: int, timeout: float) -> list[dict[str, Any]]:
    """Wait until the workers reported ``count`` tasks of ``database`` done (since the start)."""
    return events(procs, lambda c, e: e.get("event") == "done" and e["database"] == database, count,
                  timeout=timeout, what=f"tasks of {database} done")


def test_with_one_server_stopped_the_other_tenants_keep_working_and_all_recover(
        procs: Supervisor, shard_server: PostgresServer) -> None:
    worker = start(procs, "serve", "--lease", "5")
    event_of(procs, worker, "ready")
    for n in range(3):
        Task.objects.ensure(f"before-{n}", tenant=ON_A[0], queue="default")
        Task.objects.ensure(f"before-{n}", tenant=ON_B[0], queue="default")
    done_events(procs, A, 3, 60)
    done_events(procs, B, 3, 60)
    stranded = Task.objects.claim("stranded", tenant=ON_A[1], lease=600).claim
    assert stranded is not None

    connections[B].close()
    shard_server.halt()  # pg_ctl stop: the second server is down, for real
    for n in range(3):
        Task.objects.ensure(f"during-{n}", tenant=ON_A[0], queue="default")
    done_events(procs, A, 6, 60)  # the worker goes on with the tenants of the other database
    ok = Task.objects.claim("by-key", tenant=ON_A[2]).claim
    assert ok is not None and ok.using == A
    ok.complete()
    failed = re.escape(f"task database 'shard2' (tenant {ON_B[0]!r}) cannot be reached")
    with pytest.raises(OperationalError, match=failed):
        Task.objects.claim("during", tenant=ON_B[0])
    with pytest.raises(OperationalError, match=failed):
        Task.objects.ensure("during", tenant=ON_B[0], queue="default")
    # claim_next() without a tenant: whichever database its round starts at, the one that answers
    # hands out its tasks; once it has none, the stopped one's error is raised.
    Task.objects.ensure("manual-0", tenant=ON_A[0], queue="manual")
    Task.objects.ensure("manual-1", tenant=ON_A[1], queue="manual")
    assert [c.using for _ in range(2) for c in Task.objects.claim_next(queue="manual")] == [A, A]
    with pytest.raises(OperationalError, match="task database 'shard2' cannot be reached"):
        Task.objects.claim_next(queue="manual")
    # The sweeper still reclaims the other database, and fails (exit 3) naming the stopped one.
    Task.objects.db_manager(A).filter(pk=stranded.task_id).update(lease_expires_at="2000-01-01T00:00:00Z")
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as stopped:
        call_command("taskclaim_reclaim", "--json", stdout=out, stderr=err)
    assert stopped.value.returncode == 3 and "'shard2'" in str(stopped.value)
    report = json.loads(out.getvalue())
    assert [(r["key"], r["database"]) for r in report["reclaimed"]] == [("stranded", A)]
    assert "shard2" in report["unreachable"] and "cannot be reached" in err.getvalue()
    registry = CollectorRegistry()
    metrics.install(registry)
    try:
        assert registry.get_sample_value("taskclaim_database_up", {"database": B}) == 0
        assert registry.get_sample_value("taskclaim_database_up", {"database": A}) == 1
        assert registry.get_sample_value("taskclaim_tasks", {"status": "succeeded", "database": A}) == 7
    finally:
        metrics.uninstall(registry)

    shard_server.resume()
    recovered = wait_until(lambda: _claims(ON_B[0]), timeout=60, what="a claim on the restarted server")
    assert recovered.using == B
    recovered.complete()
    for n in range(3):
        Task.objects.ensure(f"after-{n}", tenant=ON_B[1], queue="default")
    done_events(procs, B, 6, 60)  # the same worker process, reconnected
    worker.proc.stdin.close()  # type: ignore[union-attr]
    exit_event = event_of(procs, worker, "exit")
    assert worker.wait(60) == 0, worker.stderr()
    assert exit_event["failed"] == exit_event["unrecorded"] == 0
    assert effects_by_task(B) == {**{f"{ON_B[0]}/before-{n}": 1 for n in range(3)},
                                  **{f"{ON_B[1]}/after-{n}": 1 for n in range(3)}}
    assert len(effects_by_task(A)) == 6


def _claims(tenant: str) -> Any:
    try:
        return Task.objects.claim("after-restart", tenant=tenant).claim
    except OperationalError:
        return None


# ---- one server hung (SIGSTOP) ---------------------------------------------------------------

def _lock_waiters() -> int:
    """Sessions of the second database waiting for the advisory lock of a ``wait-*`` task."""
    with connections[B].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted", [])
        return int(cursor.fetchone()[0])


def _advisory(action: str) -> None:
    with connections[B].cursor() as cursor:
        cursor.execute(f"SELECT pg_advisory_{action}(%s)", [WAIT_LOCK])


@pytest.mark.parametrize("postmaster_only", [False, True], ids=["server", "postmaster"])
def test_a_hung_server_delays_only_its_own_tenants(procs: Supervisor, shard_server: PostgresServer,
                                                   postmaster_only: bool) -> None:
    """One worker over both databases; the second server SIGSTOPped while a statement of the worker
    waits on it. Its kernel still acknowledges TCP, so nothing times out: only a worker that serves
    each database apart keeps running the other database's tasks."""
    worker = start(procs, "serve", "--lease", "30")
    event_of(procs, worker, "ready")
    for n in range(3):
        Task.objects.ensure(f"b-{n}", tenant=ON_B[n], queue="default")
    done_events(procs, B, 3, 60)
    _advisory("lock")
    Task.objects.ensure("wait-0", tenant=ON_B[0], queue="default")
    event_of(procs, worker, "waiting")
    wait_until(_lock_waiters, timeout=30, what="the worker's statement waiting on the second server")
    for n in range(3):
        Task.objects.ensure(f"b-later-{n}", tenant=ON_B[n], queue="default")
    with shard_server.frozen(postmaster_only=postmaster_only):  # continued however the block ends
        if postmaster_only:
            _advisory("unlock")  # the sessions run on; a new connection waits for the postmaster
        for n in range(40):
            Task.objects.ensure(f"a-{n}", tenant=ON_A[n % 3], queue="default")
        done_events(procs, A, 40, 20)  # all of them, promptly: the broken worker ran 0 to 14
    if not postmaster_only:
        _advisory("unlock")
    done_events(procs, B, 7, 60)  # resumed: the task in flight and those queued meanwhile, once
    worker.proc.stdin.close()  # type: ignore[union-attr]
    exit_event = event_of(procs, worker, "exit")
    assert worker.wait(60) == 0, worker.stderr()
    assert exit_event["succeeded"] == 47 and exit_event["failed"] == exit_event["unrecorded"] == 0
    assert effects_by_task(A) == {f"{ON_A[n % 3]}/a-{n}": 1 for n in range(40)}
    assert effects_by_task(B) == {**{f"{ON_B[n]}/b-{n}": 1 for n in range(3)}, f"{ON_B[0]}/wait-0": 1,
                                  **{f"{ON_B[n]}/b-later-{n}": 1 for n in range(3)}}
    assert set(Task.objects.db_manager(B).values_list("attempts", flat=True)) == {1}


@override_settings(TASKCLAIM_DATABASE_TIMEOUT=3)
def test_claim_next_in_user_code_skips_a_hung_database(shard_server: PostgresServer) -> None:
    """``claim_next()`` without a tenant waits for a hung database at most its deadline, then
    serves the others (and skips the hung one while its visit is out: after the first wait, every
    later call returns at once, issue 40, item 21); a claim its late visit made is given back, the
    attempt not counted."""
    Task.objects.ensure("m-b", tenant=ON_B[0], queue="manual")
    for n in range(4):
        Task.objects.ensure(f"m-a-{n}", tenant=ON_A[n % 3], queue="manual")
    connections[B].close()

    def calls() -> tuple[list[Any], list[float], BaseException | None]:
        got, took = [], []
        for _ in range(4):
            started = time.monotonic()
            got += [(c.key, c.using) for c in Task.objects.claim_next(queue="manual")]
            took.append(time.monotonic() - started)
        started = time.monotonic()
        try:
            Task.objects.claim_next(queue="manual")
        except DatabaseUnreachable as exc:
            return got, took, exc
        finally:
            took.append(time.monotonic() - started)
            connections.close_all()
        return got, took, None

    with shard_server.frozen():
        # On a daemon thread: the broken call never returns, and must not keep pytest from exiting.
        got, took, error = call_in_thread(calls, timeout=30, what="claim_next() with the second server hung")
    assert sorted(got) == [(f"m-a-{n}", A) for n in range(4)]
    # The first call that visits the hung database waits for it its deadline (3 s), no more; the later
    # ones skip it while that visit is out: none waits again.
    assert [t >= 1.5 for t in took].count(True) == 1 and max(took) < 3 + 5, took
    assert error is not None and "'shard2'" in str(error) and "TASKCLAIM_DATABASE_TIMEOUT" in str(error)
    assert isinstance(error, OperationalError)  # workers wait and try again, as for a server down

    def claim_b() -> Any:
        try:
            return Task.objects.claim_next(queue="manual")
        except DatabaseUnreachable:
            return None  # the late visit still out

    [late] = wait_until(claim_b, timeout=30, what="the resumed database's task")
    assert (late.key, late.using) == ("m-b", B)
    assert Task.objects.db_manager(B).get(key="m-b").attempts == 1  # the late visit's claim was given back
    assert threading.active_count() < 10


def test_a_concurrent_worker_serves_each_database_with_a_pool_of_its_own() -> None:
    """``work(concurrency=3)`` over two task databases: a lane per database, each with three slots
    (six tasks in flight at once, three in each database), every task once, in its tenant's database."""
    from django_taskclaim.worker import work

    for n in range(12):
        Task.objects.ensure(f"pool-{n}", tenant=ON_A[n % 3], queue="default")
        Task.objects.ensure(f"pool-{n}", tenant=ON_B[n % 3], queue="default")
    lock, in_flight, most = threading.Lock(), {A: 0, B: 0}, {A: 0, B: 0}
    six = threading.Barrier(6, timeout=30)

    arrived = [0]

    def handler(claim: Any) -> str:
        with lock:
            in_flight[claim.using] += 1
            most[claim.using] = max(most[claim.using], in_flight[claim.using])
            arrived[0] += 1
            first = arrived[0] <= 6
        if first:
            six.wait()  # the first six: three in each database at once
        with lock:
            in_flight[claim.using] -= 1
        return claim.using

    stats = work(handler, owner="pools", concurrency=3, until_drained=True, poll=0.05)
    assert stats.succeeded == 24 and most == {A: 3, B: 3}
    for alias in (A, B):
        assert set(Task.objects.db_manager(alias).values_list("status", "result")) == {("succeeded", alias)}
