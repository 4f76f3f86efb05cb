"""A test run never waits for ever (the configurations leg of CI once hung until CI was killed).

A server frozen with SIGSTOP is never left so: ``freeze()`` survives a backend that exits as it
runs, and a failure part-way continues what it stopped; ``stop()`` ends a frozen server. pytest
names the threads a test left running instead of waiting for them at exit, and the runner stops
a pytest run past its deadline with its threads' stacks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from devtools import stacks
from devtools.polling import wait_until
from devtools.processes import state
from devtools.servers import PostgresServer, postgres_bindir
from devtools.threads import call_in_thread
from tests.conftest import ROOT, requirement_missing

pytestmark = pytest.mark.slow


def all_stopped(pids: list[int]) -> None:
    """Wait for the kernel to stop each of ``pids`` (a signal is delivered when the process next
    runs); a backend that was exiting when it was stopped ends as a zombie (its stopped postmaster
    cannot reap it) or is gone, which holds nothing either."""
    wait_until(lambda: {state(pid) for pid in pids} <= {"T", "Z", "gone"} and "T" in {state(pid) for pid in pids},
               timeout=10, what=f"processes {pids} to stop")


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    if postgres_bindir() is None:
        requirement_missing("PostgreSQL (server binaries)")
    with PostgresServer() as started:
        yield started


def connect(server: PostgresServer, timeout: int = 10) -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=server.port, user="postgres", dbname="postgres",
                           connect_timeout=timeout, autocommit=True)


def test_freeze_leaves_out_a_backend_that_exits_meanwhile_and_thaw_resumes_the_server(
        server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race that hung CI: a connection closed just before ``freeze()`` (as the test of a hung
    database does), its backend listed, then reaped by the postmaster before its SIGSTOP. The
    freeze raised ProcessLookupError with the postmaster already stopped, and every later
    connection (the fixture's teardown, the next test's) waited for ever. Here the backend's exit
    is made to fall in that gap every time: a real backend, a real exit, a fixed order."""
    conn = connect(server)
    backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
    listed = server.processes

    def listing_then_the_backend_exits() -> list[int]:
        pids = listed()
        assert backend in pids
        conn.close()
        wait_until(lambda: state(backend) == "gone", timeout=30, what="the postmaster to reap the backend")
        return pids

    monkeypatch.setattr(server, "processes", listing_then_the_backend_exits)
    stopped = server.freeze()
    monkeypatch.undo()
    try:
        assert backend not in stopped and stopped[0] == server.processes()[0]
        all_stopped(stopped)
        with pytest.raises(psycopg.OperationalError):
            connect(server, timeout=2)  # frozen: the kernel accepts, nobody answers
    finally:
        server.thaw(stopped)
    assert {state(pid) for pid in server.processes()} <= {"S", "R", "D"}
    with connect(server) as again:
        assert again.execute("SELECT 1").fetchone() == (1,)


def test_frozen_thaws_the_server_however_the_block_ends(server: PostgresServer) -> None:
    with pytest.raises(RuntimeError, match="left"), server.frozen() as stopped:
        all_stopped(stopped)
        raise RuntimeError("a test failed with the server frozen, and left")
    assert "T" not in {state(pid) for pid in stopped}
    with connect(server) as again:
        assert again.execute("SELECT 1").fetchone() == (1,)


def test_thaw_all_continues_what_a_test_left_frozen(server: PostgresServer) -> None:
    server.freeze(postmaster_only=True)  # and forgot the ids
    server.thaw_all()
    assert "T" not in {state(pid) for pid in server.processes()} and server.running()


def test_stop_ends_a_server_left_frozen(server: PostgresServer) -> None:
    """Frozen, the postmaster never sees pg_ctl's signal: pg_ctl gave up after 60 s and the server
    stayed behind, stopped, holding its port and memory."""
    stopped = server.freeze()
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 30
    wait_until(lambda: all(state(pid) in ("gone", "Z") for pid in stopped), timeout=30,
               what="the frozen server's processes to end")


def test_pytest_names_the_threads_a_test_left_running_instead_of_waiting_for_them(tmp_path: Path) -> None:
    """A non-daemon thread that never ends (a worker started by a test and never stopped): the
    interpreter would wait for it at exit for ever, and the runner for pytest."""
    (tmp_path / "test_left.py").write_text(textwrap.dedent("""
        import threading

        def test_leaves_a_thread() -> None:
            threading.Thread(target=threading.Event().wait, name="never-ends").start()
    """))
    env = dict(os.environ, PYTHONPATH=str(ROOT), DJANGO_SETTINGS_MODULE="tests.settings", TASKCLAIM_TEST_DB="sqlite",
               TASKCLAIM_TEST_THREADS_AT_EXIT="1")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                           "-p", "no:randomly", "-q", "--rootdir", str(tmp_path), str(tmp_path / "test_left.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert time.monotonic() - started < 60
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "1 passed" in done.stdout
    assert "would wait for ever at exit for 1 thread(s)" in done.stderr and "'never-ends'" in done.stderr
    assert "in wait" in done.stderr, done.stderr  # its stack: where it waits


def test_stacks_name_each_thread_left_running_and_where_it_waits() -> None:
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="left-here")
    thread.start()
    try:
        assert thread in stacks.threads_left(0.2)
        assert "thread 'left-here'" in stacks.stacks([thread]) and "in wait" in stacks.stacks([thread])
    finally:
        release.set()
        thread.join(10)
    assert thread not in stacks.threads_left(5)


def test_an_idle_executor_worker_is_not_a_thread_left_running() -> None:
    """concurrent.futures ends its idle workers at exit by itself (asgiref's executor leaves one):
    they hold up nothing, and must not fail the run (every CI leg did, 60 s late)."""
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="idle-worker")
    executor.submit(lambda: None).result(10)
    [worker] = [t for t in threading.enumerate() if t.name.startswith("idle-worker")]
    try:
        assert worker.is_alive() and not worker.daemon
        assert worker not in stacks.threads_left(0.2)
    finally:
        executor.shutdown(wait=True)


def test_a_call_in_a_thread_that_never_returns_fails_its_deadline_and_holds_nothing() -> None:
    never = threading.Event()
    with pytest.raises(TimeoutError, match="the call that never returns"):
        call_in_thread(never.wait, timeout=0.3, what="the call that never returns")
    [left] = [t for t in threading.enumerate() if t.name == "call-in-thread: the call that never returns"]
    assert left.daemon  # nothing for the interpreter to wait for at exit
    assert call_in_thread(lambda: 7, timeout=10, what="seven") == 7
    with pytest.raises(ZeroDivisionError):
        call_in_thread(lambda: 1 / 0, timeout=10, what="a division")
    never.set()


def test_the_runner_stops_a_run_past_its_deadline_with_its_stacks(monkeypatch: pytest.MonkeyPatch,
                                                                  capfd: pytest.CaptureFixture[str]) -> None:
    from tests import __main__ as runner

    monkeypatch.setattr(runner, "RUN_DEADLINE", 2)
    hung = ("import os, sys, threading; from devtools import stacks; stacks.dump_on_signals(2); "
            "print('hung', flush=True); threading.Event().wait()")
    started = time.monotonic()
    code = runner.run_with_deadline([sys.executable, "-c", hung], dict(os.environ, PYTHONPATH=str(ROOT)),
                                    "the hung run")
    assert code == 124 and time.monotonic() - started < 30
    out, err = capfd.readouterr()
    assert "hung" in out
    assert "the hung run did not end within 2 s" in err
    assert "Current thread" in err or "Thread 0x" in err, err  # faulthandler's dump of its stacks
    assert signal.SIGUSR1 in stacks.DUMP_SIGNALS
