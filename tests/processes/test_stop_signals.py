"""Stop signals at random moments (issue 40, item 16): a loop whose signal handler called
``threading.Event.set()`` hung when the signal came while the main thread held the event's lock in
``wait()`` (the reclaim loop under CI, 20 s after SIGINT; 17 of 40 plain children). Every handler
now only sets a :class:`~django_taskclaim.stopping.Stop`: every child exits, and promptly."""

from __future__ import annotations

import random
import signal
import time

import pytest

CHILDREN = 40
#: A child that has not exited this long after its signal hangs (an exit takes milliseconds).
DEADLINE = 10.0


@pytest.mark.parametrize("mode", ["reclaim", "worker", "command"])
def test_every_loop_stopped_by_a_signal_at_a_random_moment_exits(processes, mode: str) -> None:  # type: ignore[no-untyped-def]
    children = [processes.start("tests.programs.stop_loops", mode) for _ in range(CHILDREN)]
    for child in children:
        child.event("ready", timeout=60)
    chance = random.Random()
    for child in children:  # one at a time, so the spinning children do not crowd the machine
        child.send("go")
        child.event("looping", timeout=60)
        time.sleep(chance.uniform(0.0, 0.005))  # the random moment, inside the spinning loop
        child.signal(chance.choice([signal.SIGTERM, signal.SIGINT]))
    deadline = time.monotonic() + DEADLINE
    hung = []
    for child in children:
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            hung.append(child.pid)
    assert not hung, f"{len(hung)} of {CHILDREN} children still running {DEADLINE:g} s after their signal: {hung}"
    for child in children:
        assert child.finish(5)["event"] == "stopped"
