"""The fleet the process tests fork their racers from (tests/programs/fleet.py): its copies are
processes of their own, each with its own database session, and a copy that fails fails it."""

from __future__ import annotations

import pytest

from devtools.processes import Supervisor

pytestmark = pytest.mark.django_db(transaction=True)


def test_copies_are_processes_of_their_own_each_with_its_own_session(processes: Supervisor) -> None:
    from django_taskclaim.models import Task

    fleet = processes.start("tests.programs.fleet", "3", "tests.programs.claimer", "race", "k", group=True)
    ready = [fleet.event("ready", timeout=60) for _ in range(3)]
    assert len({r["pid"] for r in ready}) == 3 and fleet.pid not in {r["pid"] for r in ready}
    fleet.send("go")
    done = [fleet.event("done", timeout=60) for _ in range(3)]
    fleet.end_input()
    fleet.finish(60)
    # One claim won; the other two read it as a duplicate: three sessions, each its own statement.
    assert sorted(d["claimed"] for d in done) == [False, False, True]
    assert Task.objects.get(key="k").attempt_set.count() == 3


def test_a_copy_that_fails_fails_the_fleet(processes: Supervisor) -> None:
    fleet = processes.start("tests.programs.fleet", "2", "tests.programs.claimer", "no-such-mode", group=True)
    fleet.end_input()
    with pytest.raises(AssertionError, match="exited with code 1"):
        fleet.finish(60)
    assert "fleet: process" in fleet.stderr() and "exited with code 2" in fleet.stderr()
