"""The shared development package: the supervisor kills, freezes and resumes children, and polls end on time."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from devtools.events import parse
from devtools.polling import wait_until
from devtools.processes import Supervisor

ROOT = Path(__file__).resolve().parents[2]


def state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``T`` stopped, ``S`` sleeping, ``R`` running)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def supervisor() -> Supervisor:
    return Supervisor(cwd=str(ROOT), env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_sigkill_ends_a_child_and_its_exit_code_says_so() -> None:
    with supervisor() as sup:
        child = sup.start("tests.programs.supervised", "ticker")
        sup.event_of(child, "tick", timeout=30)
        child.kill()
        assert child.wait(timeout=10) == -signal.SIGKILL
        assert sup.alive() == []


def test_sigstop_freezes_a_child_and_sigcont_resumes_it() -> None:
    with supervisor() as sup:
        child = sup.start("tests.programs.supervised", "ticker")
        sup.event_of(child, "tick", timeout=30)
        child.stop()
        wait_until(lambda: state(child.pid) == "T", timeout=10, what="the kernel to stop the child")
        while sup.events.next(0.2):  # ticks written before the stop
            pass
        assert sup.events.next(0.5) is None, "a stopped child went on ticking"
        child.cont()
        wait_until(lambda: state(child.pid) != "T", timeout=10, what="the child to resume")
        _, tick = sup.wait_for(lambda c, e: c is child and e["event"] == "tick", timeout=10, what="a tick")
        assert tick["n"] > 0


def test_waiting_past_a_deadline_fails_and_names_what_it_waited_for() -> None:
    with supervisor() as sup:
        child = sup.start("tests.programs.supervised", "ticker")
        started = time.monotonic()
        with pytest.raises(AssertionError, match="did not exit within 0.3s"):
            child.wait(timeout=0.3)
        with pytest.raises(AssertionError, match="the end of the world"):
            sup.wait_for(lambda c, e: e["event"] == "never", timeout=0.3, what="the end of the world")
        assert time.monotonic() - started < 10
        assert child.alive()
    assert not child.alive() and child.returncode == -signal.SIGKILL  # the supervisor killed the leftover


def test_leftovers_are_killed_even_when_stopped() -> None:
    with supervisor() as sup:
        child = sup.start("tests.programs.supervised", "ticker")
        sup.event_of(child, "tick", timeout=30)
        child.stop()
        wait_until(lambda: state(child.pid) == "T", timeout=10, what="the kernel to stop the child")
    assert child.returncode == -signal.SIGKILL


def test_events_round_trip_through_stdin_and_stdout_and_stray_lines_are_skipped() -> None:
    with supervisor() as sup:
        child = sup.start("tests.programs.supervised", "echo")
        ready = sup.event_of(child, "ready", timeout=30)
        assert ready["at"].startswith("2026-12-03")  # emit() writes what JSON cannot hold as str
        child.send("hello")
        assert sup.event_of(child, "echo", timeout=30)["line"] == "hello"
        assert child.proc.stdin is not None
        child.proc.stdin.close()
        log = sup.join(timeout=30)
    assert child.returncode == 0, child.stderr()
    assert [e["event"] for _, e in log] == ["ready", "echo", "bye"]


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
