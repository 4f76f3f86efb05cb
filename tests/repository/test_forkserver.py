"""The fork server (``devtools/forkserver.py``): children forked from a process that set Django up
behave as the fresh interpreters they replace."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from devtools import forkserver
from devtools.processes import Supervisor

ROOT = Path(__file__).resolve().parents[2]
SUPERVISED = "tests.programs.supervised"


@pytest.fixture
def sup(monkeypatch: pytest.MonkeyPatch) -> Supervisor:
    monkeypatch.setenv("TASKCLAIM_FORKSERVER", "1")
    # An environment of its own: its fork server is this test's (the first child starts afresh).
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "tests.settings",
           "TASKCLAIM_TEST_DB": "sqlite", "FORKSERVER_TEST": os.urandom(8).hex()}
    with Supervisor(cwd=str(ROOT), env=env) as supervisor:
        yield supervisor  # type: ignore[misc]


def test_children_after_the_first_are_forked_set_up_each_its_own_process(sup: Supervisor) -> None:
    first, second, third = (sup.start(SUPERVISED, "probe", "x") for _ in range(3))
    events = [child.event("started", timeout=60) for child in (first, second, third)]
    assert isinstance(first.proc, subprocess.Popen)
    assert isinstance(second.proc, forkserver.Forked) and isinstance(third.proc, forkserver.Forked)
    assert [e["django_ready"] for e in events] == [False, True, True]  # set up once, before the fork
    assert len({e["pid"] for e in events} | {os.getpid()}) == 4
    assert {e["pid"] for e in events} == {first.pid, second.pid, third.pid}
    assert all(e["name"] == "__main__" and e["argv"][1:] == ["probe", "x"] for e in events)
    for child, code in ((first, "0"), (second, "0"), (third, "5")):
        assert child.send(code)
    assert [c.wait(30) for c in (first, second, third)] == [0, 0, 5]


@pytest.mark.parametrize(("what", "code", "said"), [
    ("raise", 1, "ValueError: the child's own error"), ("thread", 0, ""), ("7", 7, "")])
def test_a_forked_child_exits_as_the_interpreter_would(sup: Supervisor, what: str, code: int, said: str) -> None:
    sup.start(SUPERVISED, "probe").event("started", timeout=60)  # the first: afresh
    child = sup.start(SUPERVISED, "probe")
    assert isinstance(child.proc, forkserver.Forked)
    child.event("started", timeout=60)
    child.send(what)
    assert child.wait(30) == code
    assert said in child.stderr()
    if what == "thread":  # the interpreter waited for the thread before it exited
        assert child.ended(10) and [e["event"] for e in child.events] == ["started", "thread done"]


def test_a_forked_child_is_signalled_by_its_pid_and_its_group(sup: Supervisor) -> None:
    sup.start(SUPERVISED, "probe").event("started", timeout=60)
    child, leader = sup.start(SUPERVISED, "probe"), sup.start(SUPERVISED, "probe", group=True)
    for c in (child, leader):
        c.event("started", timeout=60)
    assert os.getpgid(leader.pid) == leader.pid != os.getpgid(child.pid)
    child.kill()
    leader.signal(signal.SIGTERM)
    assert (child.wait(30), leader.wait(30)) == (-signal.SIGKILL, -signal.SIGTERM)


def test_a_child_that_changes_its_environment_before_setting_django_up_starts_afresh(sup: Supervisor) -> None:
    sup.start(SUPERVISED, "reset").finish(60)
    child = sup.start(SUPERVISED, "reset")
    assert isinstance(child.proc, forkserver.Forked)
    assert child.finish(60)["event"] == "set up"
    started = [e for e in child.events if e["event"] == "started"]
    # Forked set up, then run again from the start by a fresh interpreter in the same process.
    assert [e["django_ready"] for e in started] == [True, False] and {e["pid"] for e in started} == {child.pid}


def test_off_every_child_is_a_fresh_interpreter(sup: Supervisor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKCLAIM_FORKSERVER", "0")
    children = [sup.start(SUPERVISED, "probe") for _ in range(2)]
    assert all(isinstance(c.proc, subprocess.Popen) for c in children)
    assert [c.event("started", timeout=60)["django_ready"] for c in children] == [False, False]
