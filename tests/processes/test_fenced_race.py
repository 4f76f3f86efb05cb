"""``fenced()`` holds the task from its token check to its commit, against a real takeover.

An owner process enters ``fenced()`` and is held there (after the check, before the commit)
past its lease. A second process then claims the key, as it may once the lease has expired by
the database clock. The owner's lock must hold it off: the taker's first claim, with a short
lock wait, fails on the lock (``blocked``); the owner then commits its effect and completion,
and the taker, once let through, finds the task done. If ``fenced()`` checked the token without
locking the row, the taker would take over at once and the owner's commit would be refused.
"""

from __future__ import annotations

import time

import pytest

from django_taskclaim.models import Attempt, Task
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_takeover_waits_for_an_owner_inside_fenced(processes, spawn) -> None:  # type: ignore[no-untyped-def]
    owner = spawn("fenced-owner", "job", "--lease", "1")
    owner.event("inside", timeout=60)
    # Held inside fenced() until its lease has run out by the database clock.
    deadline = time.monotonic() + 60
    while not Task.objects.expired().filter(key="job").exists():
        assert time.monotonic() < deadline, "the owner's lease never expired"
        time.sleep(0.05)  # a poll of the lease, with the deadline above
    taker = spawn("taker", "job", "--lease", "30")
    first = taker.event(timeout=60)
    blocked = first["event"] == "blocked"
    # Let the owner commit either way, so that the final state is checked too.
    owner.send("go")
    processes.join(timeout=120)
    assert [p.returncode for p in processes.children] == [0, 0], processes.failures()
    assert blocked, f"the takeover was not held off by the owner inside fenced(): {first}"
    assert owner.events[-1] == {"event": "committed", "token": 1}
    assert taker.events[-1] == {"event": "done", "claimed": False, "token": 1, "status": "succeeded"}
    # Exactly once: one effect, written under the token that completed the task.
    task = Task.objects.get(key="job")
    assert (task.status, task.fencing_token) == ("succeeded", 1)
    assert list(Effect.objects.values_list("task_key", "token")) == [("job", 1)]
    assert not Attempt.objects.filter(outcome="taken_over").exists()
