"""Keepalive heartbeats from a background thread, and losing the lease while working."""

from __future__ import annotations

import threading
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from devtools.polling import wait_until
from django_taskclaim.exceptions import StaleClaim
from django_taskclaim.models import Attempt, Task
from tests.conftest import expire

pytestmark = pytest.mark.django_db(transaction=True)


def until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    wait_until(predicate, timeout=timeout, interval=0.02, what="the condition")


def test_keepalive_renews_the_lease_while_the_block_runs() -> None:
    claim = Task.objects.claim("job", lease=0.6).claim
    seen = set()
    with claim.keepalive():
        # Work that outlives the lease several times over; the lease must keep moving.
        def renewed_twice() -> bool:
            seen.add(Task.objects.get(key="job").lease_expires_at)
            return len(seen) >= 3

        until(renewed_twice)
        assert Task.objects.live().filter(key="job").exists()
    assert not claim.lost.is_set()
    claim.complete("ok")
    assert Task.objects.get(key="job").status == "succeeded"


def test_keepalive_notices_a_takeover_and_raises_at_the_end() -> None:
    claim = Task.objects.claim("job", lease=0.6).claim
    with pytest.raises(StaleClaim, match="keepalive"), claim.keepalive():
        expire(claim)
        assert Task.objects.claim("job", owner="thief").claimed
        assert claim.lost.wait(10), "the keepalive thread did not notice the takeover"
    assert isinstance(claim.lost_reason, StaleClaim)
    assert Task.objects.get(key="job").owner == "thief"


def test_run_once_wait_polls_until_the_owner_finishes(settings) -> None:  # type: ignore[no-untyped-def]
    import threading

    from django.db import connection

    from django_taskclaim import run_once

    settings.TASKCLAIM_POLL_INTERVAL = 0.02
    owner = Task.objects.claim("job", owner="first").claim
    results: list[object] = []

    def waiter() -> None:
        try:
            results.append(run_once("job", lambda: "second ran", on_busy="wait"))
        finally:
            connection.close()

    thread = threading.Thread(target=waiter)
    thread.start()
    until(lambda: Task.objects.get(key="job").attempt_set.filter(outcome="duplicate").exists())
    owner.complete("first result")
    thread.join(10)
    assert results == ["first result"]


def test_run_once_wait_takes_over_when_the_owner_dies(settings) -> None:  # type: ignore[no-untyped-def]
    from django_taskclaim import run_once

    settings.TASKCLAIM_POLL_INTERVAL = 0.02
    Task.objects.claim("job", owner="dead", lease=0.3)
    # The dead owner never heartbeats: once its lease expires by the DB clock, we run it.
    assert run_once("job", lambda: "recovered", on_busy="wait", lease=5) == "recovered"
    task = Task.objects.get(key="job")
    assert (task.fencing_token, task.result) == (2, "recovered")


def test_run_once_inside_a_transaction_needs_no_heartbeat() -> None:
    """A view under ATOMIC_REQUESTS: the claim is uncommitted, its row lock holds the task."""
    from django.db import transaction

    from django_taskclaim import run_once

    def slow() -> str:
        # Longer than the lease: a heartbeat from another connection would find no claim.
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            time.sleep(0.05)
        return "done in one transaction"

    with transaction.atomic():
        assert run_once("job", slow, lease=0.3) == "done in one transaction"
    assert Task.objects.get(key="job").result == "done in one transaction"


class Thief:
    """Another connection (its own thread) that tries to take the task over until told to stop,
    and notes the latest lease expiry it saw."""

    def __init__(self, key: str) -> None:
        import threading

        self.key, self.took, self.tries = key, False, 0
        self.latest: object = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        from django.db import connection

        try:
            while not self.stop.is_set() and not self.took:
                self.tries += 1
                outcome = Task.objects.claim(self.key, owner="thief", lease=30)
                self.took, self.latest = outcome.claimed, outcome.task.lease_expires_at
                self.stop.wait(0.05)
        finally:
            connection.close()

    def __enter__(self) -> Thief:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def alive(claim, kind: str, interval: float, body) -> None:  # type: ignore[no-untyped-def]
    """Run ``body()`` under ``claim.keepalive()`` (``sync``), or under ``claim.akeepalive()`` in a
    coroutine that this sync caller runs through ``async_to_sync``, the body going back to this
    thread through ``sync_to_async`` (a sync view inside ``atomic()`` running async work)."""
    if kind == "sync":
        with claim.keepalive(interval=interval):
            body()
        return

    async def main() -> None:
        async with claim.akeepalive(interval=interval):
            await sync_to_async(body)()

    async_to_sync(main)()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_keepalive_inside_atomic_keeps_a_committed_claim_alive(kind: str) -> None:
    """Claimed (and committed) before the transaction: the thread heartbeats on its own connection.
    The async twin the same (issue 25.2: it used to rest, trusting a row lock nobody held).

    (The block reads nothing itself: on SQLite without WAL, a transaction that has read holds a
    shared lock that stops every other connection's commit, heartbeats and takeovers alike.)
    """
    import datetime as dt

    from django.db import transaction

    claim = Task.objects.claim("job", owner="me", lease=1).claim
    start = claim.lease_expires_at

    def work() -> None:
        with Thief("job") as thief:
            # Three lease lengths by the database clock, while another connection keeps trying.
            until(lambda: thief.tries >= 5 and thief.latest is not None
                       and thief.latest > start + dt.timedelta(seconds=3), timeout=30)  # type: ignore[operator]
            assert not thief.took, "another worker took over a task whose owner was alive"

    with transaction.atomic():
        alive(claim, kind, 0.2, work)
    assert not claim.lost.is_set()
    claim.complete("mine")
    assert Task.objects.values_list("owner", "status", "result").get() == ("me", "succeeded", "mine")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_keepalive_inside_atomic_reports_a_takeover(kind: str) -> None:
    """Never lose silently: a committed claim taken over while the transaction runs ends in StaleClaim."""
    from django.db import connection, transaction

    claim = Task.objects.claim("job", owner="me", lease=1).claim

    def take_over() -> None:
        try:
            expire(claim)
            assert Task.objects.claim("job", owner="thief").claimed
        finally:
            connection.close()

    def work() -> None:
        thread = threading.Thread(target=take_over)
        thread.start()
        thread.join(30)
        assert claim.lost.wait(30), "the keepalive thread did not notice the takeover"

    with pytest.raises(StaleClaim, match="keepalive"), transaction.atomic():
        alive(claim, kind, 0.1, work)
    assert Task.objects.get(key="job").owner == "thief"


def _fenced_complete(claim) -> None:  # type: ignore[no-untyped-def]
    with claim.fenced():
        claim.complete("inside")


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("action", ["complete", "fail", "release", "fenced complete"])
def test_finishing_inside_keepalive_raises_nothing(action: str, kind: str) -> None:
    """Heartbeats refused because *this* claim finished are no loss, and no fenced-off write;
    the async twin the same (issue 25.6: it raised StaleClaim and sent heartbeat_lost)."""
    from django_taskclaim.signals import heartbeat_lost

    lost: list[object] = []
    heartbeat_lost.connect(lambda **kw: lost.append(kw), weak=False, dispatch_uid="lost")
    claim = Task.objects.claim("job", lease=0.3).claim
    end = {"complete": claim.complete, "fail": lambda: claim.fail("boom"), "release": claim.release,
           "fenced complete": lambda: _fenced_complete(claim)}[action]
    try:
        alive(claim, kind, 0.01, lambda: (end(), refused_a_few_times(claim)))
    finally:
        heartbeat_lost.disconnect(dispatch_uid="lost")
    assert not claim.lost.is_set() and not lost
    assert Attempt.objects.get().stale_writes == 0


def refused_a_few_times(claim) -> None:  # type: ignore[no-untyped-def]
    """Let the heartbeat thread try the finished task a few times (past the lease)."""
    deadline = time.monotonic() + 0.4
    while time.monotonic() < deadline:
        time.sleep(0.02)


def test_fenced_then_complete_inside_atomic_and_keepalive_does_not_deadlock() -> None:
    """The caller's transaction holds the row: the thread must neither block the end of the block nor cry loss."""
    from django.db import transaction

    from tests.testapp.models import Effect

    claim = Task.objects.claim("job", lease=0.6).claim
    with transaction.atomic(), claim.keepalive(interval=0.05):
        with claim.fenced():
            Effect.objects.create(task_key="job", token=claim.token, worker="me")
        deadline = time.monotonic() + 1.5  # past the lease: the row lock holds the task meanwhile
        while time.monotonic() < deadline:
            time.sleep(0.05)
        claim.complete("done")
    assert Task.objects.get(key="job").status == "succeeded" and Effect.objects.count() == 1
    assert not claim.lost.is_set()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_keepalive_reconnects_after_its_connection_is_dropped(kind: str) -> None:
    """A heartbeat connection killed by the server (failover, idle kill) is replaced, not retried to death."""
    from django.db import connection

    if connection.vendor == "sqlite":
        pytest.skip("terminating a server session needs a database server (PostgreSQL, MySQL)")
    claim = Task.objects.claim("job", lease=0.9).claim
    seen = set()

    def work() -> None:
        until(lambda: bool(seen.add(Task.objects.get(key="job").lease_expires_at)) or len(seen) >= 2)
        with connection.cursor() as cursor:  # every session but ours: the keepalive thread's
            if connection.vendor == "postgresql":
                cursor.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                assert cursor.fetchone()[0] >= 1
            else:
                cursor.execute("SELECT id FROM information_schema.processlist "
                               "WHERE db = DATABASE() AND id <> CONNECTION_ID()")
                sessions = [row[0] for row in cursor.fetchall()]
                assert sessions
                for session in sessions:
                    cursor.execute("KILL CONNECTION %s", [session])
        seen.clear()
        # Renewed several times after the drop, for longer than one lease: a new connection.
        until(lambda: bool(seen.add(Task.objects.get(key="job").lease_expires_at)) or len(seen) >= 5)

    alive(claim, kind, 0.3, work)
    assert not claim.lost.is_set(), claim.lost_reason
    claim.complete("ok")


def keepalive_threads(claim) -> list:  # type: ignore[no-untyped-def]
    import threading

    return [t for t in threading.enumerate() if t.name == f"taskclaim-keepalive-{claim.token}"]


def test_a_block_shorter_than_one_interval_starts_no_heartbeat_thread() -> None:
    """The heartbeat thread starts once the block has run one interval: a fast task's block
    (the common case in a busy queue) costs no thread; a long one still beats."""
    claim = Task.objects.claim("short", lease=30).claim
    with claim.keepalive():
        assert keepalive_threads(claim) == []
    assert keepalive_threads(claim) == []

    claim = Task.objects.claim("long", lease=0.6).claim
    before = Task.objects.get(key="long").lease_expires_at
    with claim.keepalive():
        assert keepalive_threads(claim) == []  # not yet due: 0.2 s after the start
        until(lambda: Task.objects.get(key="long").lease_expires_at != before)
        assert len(keepalive_threads(claim)) == 1
    assert keepalive_threads(claim) == []  # joined at the end of the block
    assert not claim.lost.is_set()


def test_many_short_blocks_leave_the_starters_queue_small() -> None:
    from django_taskclaim.lifecycle import keepalive

    claim = Task.objects.claim("many", lease=300).claim
    for _ in range(3000):
        with claim.keepalive():
            pass
    assert len(keepalive._starter().queue) <= 2001  # ended blocks are dropped, not kept for 100 s


def test_short_blocks_of_a_busy_worker_leave_the_starter_asleep() -> None:
    """Blocks that end long before their first heartbeat is due do not wake the starter thread:
    woken for each task, it takes the interpreter from the worker at each of its statements."""
    from django_taskclaim.lifecycle import keepalive

    claim = Task.objects.claim("asleep", lease=300).claim
    with claim.keepalive():  # the starter exists
        pass
    starter = keepalive._starter()
    wakes = 0
    notify = starter.cond.notify

    def counting(n: int = 1) -> None:
        nonlocal wakes
        wakes += 1
        notify(n)

    def parked() -> bool:  # the starter thread waits on its condition
        with starter.cond:
            return bool(starter.cond._waiters)  # type: ignore[attr-defined]

    starter.cond.notify = counting  # type: ignore[method-assign]
    try:
        for _ in range(50):
            with claim.keepalive():
                pass
            # The worker's completion statement: the starter thread may run meanwhile.
            wait_until(parked, timeout=10, interval=0.001, what="the starter thread waiting")
    finally:
        del starter.cond.notify
    assert wakes <= 1


def test_a_short_block_keeps_no_claim_alive_once_it_ends() -> None:
    """The starter keeps an ended block queued until it is due (up to a third of the lease),
    but not its claim: a busy worker's claims, their rows and payloads, are freed as they end."""
    import gc
    import weakref

    claim = Task.objects.claim("freed", lease=300, payload={"big": "x" * 1000}).claim
    with claim.keepalive():
        pass
    gone = weakref.ref(claim)
    del claim
    gc.collect()
    assert gone() is None
