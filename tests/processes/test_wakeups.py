"""Wake on enqueue: an idle ``taskclaim_worker`` on PostgreSQL starts a task enqueued by another process
at the enqueue's commit, not at its next poll (set to 30 s here, so that only a wake-up can start the
task in time); a listening connection that is dropped is opened again. On MySQL/MariaDB and SQLite the
worker polls, and a deferred task wakes a waiting worker when it is due on every database."""

from __future__ import annotations

import datetime as dt
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections

from devtools.polling import wait_until
from devtools.processes import Child, Supervisor
from django_taskclaim import wakeups
from django_taskclaim.models import Task
from django_taskclaim.store.listening import APPLICATION_NAME, can_listen
from django_taskclaim.wakeups import wait_for_work
from django_taskclaim.worker import work

POLL = 30.0  # a worker that only polls would start the task up to this late
# PostgreSQL, not behind a transaction-mode pooler (the pgbouncer configuration polls)
postgresql_only = pytest.mark.skipif(not can_listen("default"), reason="LISTEN/NOTIFY: PostgreSQL, not pooled")


def listeners() -> list[int]:
    """The backend pids of the sessions listening for wake-ups on the test database."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
                       [APPLICATION_NAME])
        return [row[0] for row in cursor.fetchall()]


def idle_worker(processes: Supervisor, stamps: Path) -> Child:
    """A worker that polls every 30 s, once it claimed nothing and waits: its Django session is idle
    after a statement on the task table (its claim found the queue empty)."""
    worker = processes.start("django", "taskclaim_worker", "tests.programs.worker_handlers.stamps_its_start",
                             env={"TASKCLAIM_TEST_POLL_INTERVAL": str(POLL), "TASKCLAIM_TEST_STARTED_DIR": str(stamps)})

    def waiting() -> bool:
        assert worker.alive(), worker.stderr()
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND pid <> pg_backend_pid() AND application_name <> %s AND state = 'idle' "
                           "AND query LIKE %s", [APPLICATION_NAME, "%django_taskclaim_task%"])
            return cursor.fetchone()[0] == 1

    wait_until(waiting, timeout=60, what="the worker to claim nothing and wait")
    return worker


def listening(timeout: float = 30, *, besides: int | None = None) -> int:
    """The backend pid of the one session listening for wake-ups (other than ``besides``)."""
    found = wait_until(lambda: [pid for pid in listeners() if pid != besides], timeout=timeout,
                       what="the worker to listen for wake-ups")
    assert len(found) == 1, found
    return found[0]


def stopped(worker: Child) -> None:
    """SIGTERM: the idle worker exits 0 (its sessions end before the test database is dropped)."""
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.stderr()


def last_statement() -> Any:
    """When the worker's Django session (not its listening one) began its last statement."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT query_start FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid() AND application_name <> %s AND query LIKE %s",
                       [APPLICATION_NAME, "%django_taskclaim_task%"])
        return cursor.fetchall()


def quiet(window: float = 0.5) -> bool:
    """Whether the worker listens and sent no statement for ``window`` seconds (an observation
    window, not a wait for an event): it waits for a wake-up, rather than claiming again (once more
    after its listening connection opened, or in a loop)."""
    before = last_statement()
    time.sleep(window)
    return bool(listeners()) and len(before) == 1 and last_statement() == before


def start_latency(stamps: Path, key: str) -> float:
    """Seconds from just before this process enqueued ``key`` (committed on return) to its start,
    as the task itself recorded it. Enqueued once the worker is quiet (:func:`quiet`): a claim of its
    own cannot find the task by luck of timing; only a wake-up starts it before its 30 s poll."""
    wait_until(quiet, timeout=30, interval=0, what="the worker to wait, listening, sending nothing")
    enqueued = time.time()
    Task.objects.ensure(key, queue="default")
    started = wait_until(lambda: (stamps / key).exists() and float((stamps / key).read_text()), timeout=POLL / 2,
                         interval=0.005, what=f"task {key} to start before the worker's 30 s poll")
    return started - enqueued


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_an_idle_worker_starts_a_task_enqueued_by_another_process_at_its_commit(processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    worker = idle_worker(processes, tmp_path)
    latencies = [start_latency(tmp_path, f"woken{i}") for i in range(3)]
    assert max(latencies) < POLL / 2, latencies  # measured: a few milliseconds each
    print(f"enqueue-to-start latencies: {', '.join(f'{s * 1000:.1f} ms' for s in latencies)}")
    stopped(worker)


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_dropped_listening_connection_is_opened_again(processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    worker = idle_worker(processes, tmp_path)
    first = listening()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [first])
    listening(besides=first)
    assert first not in listeners()
    assert start_latency(tmp_path, "after-the-drop") < POLL / 2
    stopped(worker)


@pytest.mark.django_db(transaction=True)
def test_a_deferred_task_wakes_a_waiting_worker_when_it_is_due() -> None:
    """On PostgreSQL the enqueue announced when the task is due; elsewhere the poll finds it."""
    poll = POLL if can_listen("default") else 0.05
    started: list[float] = []
    stop = threading.Event()

    def handler(claim):  # type: ignore[no-untyped-def]
        started.append(time.time())
        stop.set()

    def serve() -> None:
        try:
            work(handler, poll=poll, stop=stop)
        finally:
            wakeups.close()  # this thread's listening connection
            connections.close_all()  # and its Django connections

    worker = threading.Thread(target=serve)
    worker.start()
    try:
        due = time.time() + 1.0
        Task.objects.ensure("deferred", queue="default", run_after=dt.datetime.fromtimestamp(due, dt.UTC))
        assert stop.wait(POLL / 2), "the deferred task did not start before the worker's poll"
    finally:
        stop.set()
        worker.join(30)
    assert due <= started[0] < due + POLL / 2


@pytest.mark.django_db(transaction=True)
def test_wait_for_work_returns_at_stop_and_after_the_poll_interval(request: pytest.FixtureRequest) -> None:
    """Every database: the wait ends at its timeout (nothing heard) and as soon as ``stop`` is set."""
    stop = threading.Event()
    began = time.monotonic()
    request.addfinalizer(wakeups.close)
    assert wait_for_work("default", ["nothing-here"], 0.3, stop) in (True, False)  # True: a listener just opened
    wait_for_work("default", ["nothing-here"], 0.3, stop)
    assert time.monotonic() - began >= 0.3
    threading.Timer(0.2, stop.set).start()
    began = time.monotonic()
    assert wait_for_work("default", ["nothing-here"], POLL, stop) is False
    assert time.monotonic() - began < POLL / 2
