"""The development tools: the supervisor starts, reads, kills, freezes and resumes children, and polls end on time."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from devtools.events import parse
from devtools.polling import wait_until
from devtools.processes import Supervisor, send, state

ROOT = Path(__file__).resolve().parents[2]


def supervisor() -> Supervisor:
    return Supervisor(cwd=str(ROOT), env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


SUPERVISED = "tests.programs.supervised"


def test_sigkill_ends_a_child_and_its_exit_code_says_so() -> None:
    with supervisor() as sup:
        child = sup.start(SUPERVISED, "ticker")
        child.event("tick", timeout=30)
        child.kill()
        assert child.wait(timeout=10) == -signal.SIGKILL
        assert sup.alive() == []
        assert child.send("anyone there?") is False  # no broken pipe raised at the caller


def test_sigstop_freezes_a_child_and_sigcont_resumes_it() -> None:
    with supervisor() as sup:
        child = sup.start(SUPERVISED, "ticker")
        child.event("tick", timeout=30)
        child.stop()
        wait_until(lambda: state(child.pid) == "T", timeout=10, what="the kernel to stop the child")
        while sup.next(0.2):  # ticks written before the stop
            pass
        assert sup.next(0.5) is None, "a stopped child went on ticking"
        child.cont()
        wait_until(lambda: state(child.pid) != "T", timeout=10, what="the child to resume")
        _, tick = sup.wait_for(lambda c, e: c is child and e["event"] == "tick", timeout=10, what="a tick")
        assert tick["n"] > 0


def test_waiting_past_a_deadline_fails_and_names_what_it_waited_for() -> None:
    with supervisor() as sup:
        child = sup.start(SUPERVISED, "ticker")
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="did not exit within 0.3 s"):
            child.wait(timeout=0.3)
        with pytest.raises(TimeoutError, match="the end of the world"):
            sup.wait_for(lambda c, e: e["event"] == "never", timeout=0.3, what="the end of the world")
        with pytest.raises(TimeoutError, match=f"never from process {child.pid}"):
            child.event("never", timeout=0.3)
        assert time.monotonic() - started < 10
        assert child.alive()
    assert not child.alive() and child.returncode == -signal.SIGKILL  # the supervisor killed the leftover


def test_a_child_that_exits_fails_the_wait_at_once_with_its_exit_code_and_stderr(tmp_path: Path) -> None:
    with supervisor() as sup:
        child = sup.start(SUPERVISED, "fail", stderr=tmp_path / "fail.stderr")  # kept after the run
        started = time.monotonic()
        with pytest.raises(AssertionError, match="(?s)exited with code 3 before ready.*boom: the child's own error"):
            child.event("ready", timeout=60)
        assert time.monotonic() - started < 30  # the end of its output, not the deadline
        with pytest.raises(AssertionError, match="exited with code 3"):
            child.finish(timeout=10)
        assert "process" in sup.failures() and "boom" in sup.failures()
    assert (tmp_path / "fail.stderr").read_text() == "boom: the child's own error\n"


def test_leftovers_are_killed_even_when_stopped() -> None:
    with supervisor() as sup:
        child = sup.start(SUPERVISED, "ticker")
        child.event("tick", timeout=30)
        child.stop()
        wait_until(lambda: state(child.pid) == "T", timeout=10, what="the kernel to stop the child")
    assert child.returncode == -signal.SIGKILL


def test_signals_of_a_group_leader_reach_its_whole_group() -> None:
    """A Celery worker and its pool: stopped, resumed and killed together, leftovers included."""
    with supervisor() as sup:
        child = sup.start(SUPERVISED, "pool", group=True)
        pool = child.event("pool", timeout=30)["pid"]
        child.stop()
        wait_until(lambda: state(child.pid) == state(pool) == "T", timeout=10, what="both to stop")
        child.cont()
        wait_until(lambda: "T" not in (state(child.pid), state(pool)), timeout=10, what="both to resume")
        assert send(pool, signal.SIGSTOP)  # one process of the group, by its pid
        wait_until(lambda: state(pool) == "T", timeout=10, what="the pool process to stop")
        assert state(child.pid) != "T"
    assert child.returncode == -signal.SIGKILL
    wait_until(lambda: state(pool) in ("gone", "Z"), timeout=10, what="the pool process to die with its leader")
    assert send(2**22 + 1, signal.SIGCONT) is False  # no such process: False, not an exception


def test_each_child_reads_its_own_events_and_the_supervisor_everyones() -> None:
    """Waiting for one child's event takes nothing from the supervisor's reading, nor the reverse."""
    with supervisor() as sup:
        a, b = sup.start(SUPERVISED, "echo"), sup.start(SUPERVISED, "echo")
        a.event("ready", timeout=30)
        b.event("ready", timeout=30)
        b.send("first")
        assert b.event("echo", timeout=30)["line"] == "first"
        a.send("second")
        assert a.event(timeout=30) == {"event": "echo", "line": "second"}
        seen = [sup.next(5) for _ in range(4)]
        assert [(c, e["line"]) for c, e in seen if e["event"] == "echo"] == [(b, "first"), (a, "second")]
        assert sorted(e["event"] for _, e in seen) == ["echo", "echo", "ready", "ready"]
        assert [e["event"] for e in a.events] == ["ready", "echo"]


def test_events_round_trip_through_stdin_and_stdout_and_stray_lines_are_skipped() -> None:
    with supervisor() as sup:
        child = sup.start(SUPERVISED, "echo")
        ready = child.event("ready", timeout=30)
        assert ready["at"].startswith("2026-12-03")  # emit() writes what JSON cannot hold as str
        child.send("hello")
        assert child.event("echo", timeout=30)["line"] == "hello"
        child.end_input()
        assert child.finish(timeout=30) == {"event": "bye"}
        log = sup.join(timeout=30)
    assert child.returncode == 0, child.stderr()
    assert [e["event"] for _, e in log] == ["ready", "echo", "bye"]


def test_a_stamped_reader_records_when_each_event_arrived() -> None:
    with Supervisor(cwd=str(ROOT), env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, stamp="seen") as sup:
        before = time.time()
        child = sup.start(SUPERVISED, "echo")
        assert before <= child.event("ready", timeout=30)["seen"] <= time.time()


def test_parse_keeps_only_whole_json_objects() -> None:
    assert parse(['{"event": "a"}\n', "log line\n", '{"event": "cut', '{"event": "b"}']) == [
        {"event": "a"}, {"event": "b"}]


def test_wait_until_returns_the_truthy_value() -> None:
    calls = iter([None, 0, "", "found"])
    assert wait_until(lambda: next(calls), timeout=10, interval=0.01, what="x") == "found"


def test_wait_until_raises_after_the_timeout_naming_what() -> None:
    calls = 0

    def never() -> bool:
        nonlocal calls
        calls += 1
        return False

    started = time.monotonic()
    with pytest.raises(TimeoutError, match="waiting for the moon"):
        wait_until(never, timeout=0.2, interval=0.01, what="the moon")
    assert 0.2 <= time.monotonic() - started < 5
    assert calls >= 3  # it polled, and once more at the deadline
