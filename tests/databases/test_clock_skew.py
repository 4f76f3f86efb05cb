"""Leases follow the database clock only: a process whose own clock is off changes nothing.

``timezone.now()`` is moved two hours either way in this process (the database's clock is not
touched), so any lease decision taken on Python's clock — expiry written at claim or heartbeat,
``live()``/``expired()``, reclaim, takeover, the ``on_busy="wait"`` poll — lands two hours off
and fails an assertion here. Every expected value is read from the database clock in SQL.

The libfaketime tests run a worker *process* whose whole clock is off. On PostgreSQL the server
keeps the true time, so the worker's decisions must follow the server. On SQLite the database
clock is SQLite's ``'now'``, computed inside the process that runs the statement, so a faked
process clock moves it too: that test pins the documented limit (docs/concepts.md).
"""

from __future__ import annotations

import datetime as dt
import os
import signal
from collections.abc import Iterator

import pytest
from django.db import connection
from django.utils import timezone

from django_taskclaim.models import Attempt, Task
from django_taskclaim.once import run_once
from django_taskclaim.store import DbNowPlus
from tests.conftest import db_now, lease_left, requirement_missing

pytestmark = pytest.mark.django_db

SKEW = dt.timedelta(hours=2)
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


@pytest.fixture(params=[SKEW, -SKEW], ids=["ahead", "behind"])
def skew(request, monkeypatch) -> Iterator[dt.timedelta]:  # type: ignore[no-untyped-def]
    """Move this process's ``timezone.now()`` by two hours (either way); the database is untouched."""
    real_now = timezone.now
    offset: dt.timedelta = request.param
    monkeypatch.setattr(timezone, "now", lambda: real_now() + offset)
    assert abs((timezone.now() - db_now()) - offset) < dt.timedelta(minutes=5)  # the skew is in effect
    yield offset


def set_lease(key: str, seconds: float) -> None:
    """Put ``key``'s lease ``seconds`` from the database clock (negative: expired that long ago)."""
    Task.objects.filter(key=key).update(lease_expires_at=DbNowPlus(seconds))


def test_claim_and_heartbeat_write_the_expiry_from_the_database_clock(skew) -> None:  # type: ignore[no-untyped-def]
    claim = Task.objects.claim("job", lease=30).claim
    assert claim is not None
    assert 20 < lease_left("job") <= 30
    claim.heartbeat(60)
    assert 50 < lease_left("job") <= 60
    # What the claim reports is the stored (database) expiry, not one computed locally.
    assert claim.lease_expires_at == Task.objects.get(key="job").lease_expires_at
    Task.objects.ensure("queued", queue="default")
    (queued,) = Task.objects.claim_next(lease=30)
    assert 20 < lease_left("queued") <= 30
    queued.heartbeat(45)
    assert 35 < lease_left("queued") <= 45


def test_live_and_expired_follow_the_database_clock(skew) -> None:  # type: ignore[no-untyped-def]
    Task.objects.claim("live", lease=600)
    Task.objects.claim("gone", lease=600)
    set_lease("gone", -600)
    assert list(Task.objects.live().values_list("key", flat=True)) == ["live"]
    assert list(Task.objects.expired().values_list("key", flat=True)) == ["gone"]


def test_reclaim_follows_the_database_clock(skew) -> None:  # type: ignore[no-untyped-def]
    Task.objects.claim("live", lease=600)
    Task.objects.claim("gone", lease=600)
    set_lease("gone", -600)
    assert Task.objects.reclaim_expired() == 1
    assert dict(Task.objects.values_list("key", "status")) == {"live": "running", "gone": "pending"}


def test_takeover_by_claim_and_claim_next_follows_the_database_clock(skew) -> None:  # type: ignore[no-untyped-def]
    for key in ("a-live", "b-gone"):  # claimed by key
        Task.objects.claim(key, owner="first", lease=600)
    for key in ("c-live", "d-gone"):  # queued work (never claimed by key)
        Task.objects.ensure(key, queue="default")
    assert len(Task.objects.claim_next(owner="first", lease=600, limit=2)) == 2
    set_lease("b-gone", -600)
    set_lease("d-gone", -600)
    # By key: a live lease is not taken over, an expired one is.
    assert not Task.objects.claim("a-live", owner="second").claimed
    taken = Task.objects.claim("b-gone", owner="second").claim
    assert taken is not None and taken.token == 2
    # Queue style: only the expired lease is handed out.
    assert [(c.key, c.token) for c in Task.objects.claim_next(owner="second", limit=10)] == [("d-gone", 2)]
    assert dict(Task.objects.values_list("key", "owner")) == {
        "a-live": "first", "b-gone": "second", "c-live": "first", "d-gone": "second"}


@pytest.fixture
def deadline() -> Iterator[None]:
    """Interrupt the test (SIGALRM raises in the main thread) if it blocks for a minute."""

    def interrupt(signum, frame):  # type: ignore[no-untyped-def]
        raise TimeoutError("still waiting after 60 s")

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 60)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_wait_poll_follows_the_database_clock(skew, deadline, settings) -> None:  # type: ignore[no-untyped-def]
    """``on_busy="wait"`` waits exactly while the lease is live by the database clock.

    Ahead, a poll on the local clock would see the lease as over at once and claim again and
    again (each claim of a live task is a recorded duplicate); behind, it would wait for two
    hours (the deadline interrupts it).
    """
    settings.TASKCLAIM_POLL_INTERVAL = 0.05
    Task.objects.claim("job", owner="other", lease=1.5)
    ran = []
    assert run_once("job", lambda: ran.append(1) or "done", on_busy="wait", lease=30) == "done"
    assert ran == [1]
    task = Task.objects.get(key="job")
    assert (task.status, task.fencing_token) == ("succeeded", 2)
    assert Attempt.objects.filter(task=task, outcome="duplicate").count() == 1


# -- a whole worker process with its clock off (libfaketime) --------------------------------


def faked_worker(spawn, offset: str):  # type: ignore[no-untyped-def]
    if not os.path.exists(FAKETIME_LIB):
        requirement_missing("libfaketime")
    # FORCE_MONOTONIC_FIX: without it libfaketime 0.9.10 breaks clock_nanosleep (time.sleep).
    proc = spawn("clock", env={"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": offset, "FAKETIME_FORCE_MONOTONIC_FIX": "1"})
    report = proc.finish(120)
    # The worker's clock really is off (by Python's clock, and by what the app is given).
    skew_seconds = report["process_clock"] - dt.datetime.now(dt.UTC).timestamp()
    expected = 7200 if offset.startswith("+") else -7200
    assert abs(skew_seconds - expected) < 300, (skew_seconds, report)
    return report


def prepare_worker_tasks() -> None:
    """What the ``clock`` worker finds: a live lease and an expired one, of tasks claimed by key and of queued ones."""
    for key in ("key-live", "key-gone"):
        Task.objects.claim(key, owner="first", lease=600)
    for key in ("queue-live", "queue-gone"):  # queued work is claimed from its queue, never by key
        Task.objects.ensure(key, queue="default")
    assert len(Task.objects.claim_next(owner="first", lease=600, limit=2)) == 2
    # On its last attempt: claim_next leaves it alone, reclaim fails it.
    Task.objects.claim("reclaim-gone", owner="first", lease=600, max_attempts=1)
    for key in ("key-gone", "queue-gone", "reclaim-gone"):
        set_lease(key, -600)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("offset", ["+2h", "-2h"])
def test_faketime_worker_follows_the_postgresql_server_clock(spawn, offset) -> None:  # type: ignore[no-untyped-def]
    if connection.vendor == "sqlite":  # MySQL's UTC_TIMESTAMP() is the server's clock too
        pytest.skip("SQLite's clock is the process's own: see the SQLite test below")
    prepare_worker_tasks()
    report = faked_worker(spawn, offset)
    # The worker saw the leases as the server does...
    assert report["live"] == ["key-live", "queue-live"]
    assert report["expired"] == ["key-gone", "queue-gone", "reclaim-gone"]
    assert report["claim_live"] is False and report["claim_gone"] is True
    assert report["claim_next"] == ["queue-gone"]  # the expired lease only (not the live one)
    assert report["reclaimed"] == 1
    # ...and the leases it wrote run from the server's clock, not its own.
    assert 20 < lease_left("key-gone") <= 30
    assert 20 < lease_left("queue-gone") <= 30
    assert dict(Task.objects.values_list("key", "status")) == {
        "key-live": "running", "key-gone": "running", "queue-live": "running", "queue-gone": "running",
        "reclaim-gone": "failed"}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_faketime_worker_on_sqlite_moves_the_database_clock_too(spawn) -> None:  # type: ignore[no-untyped-def]
    """The documented SQLite limit: its ``'now'`` is the clock of the process running the statement.

    A worker whose clock is two hours ahead writes leases that end two hours late (as seen by
    everyone else) and sees every other lease as expired. On one host all processes share the
    system clock, so this happens only when a process's clock is faked; it is the reason the
    docs ask for PostgreSQL where clocks may differ.
    """
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's clock is the server's: see the test above")
    prepare_worker_tasks()
    report = faked_worker(spawn, "+2h")
    assert report["live"] == []  # by its clock every lease here ended long ago
    assert report["claim_live"] is True
    assert 7200 + 20 < lease_left("key-live") <= 7200 + 30
