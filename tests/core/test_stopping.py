"""``django_taskclaim.stopping``: a ``Stop`` set from a signal handler, waited on by many threads;
the one SIGTERM/SIGINT helper (the processes: tests/processes/test_stop_signals.py)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from django_taskclaim.stopping import STOP_SIGNALS, Stop, stop_on_signals


def test_every_waiter_wakes_once_it_is_set_and_later_waits_return_at_once() -> None:
    stop = Stop()
    started = time.monotonic()
    assert stop.wait(0.05) is False and time.monotonic() - started >= 0.05
    woken: list[bool] = []
    waiters = [threading.Thread(target=lambda: woken.append(stop.wait(30)), daemon=True) for _ in range(4)]
    for waiter in waiters:
        waiter.start()
    stop.set()
    stop.set()  # twice: nothing more
    for waiter in waiters:
        waiter.join(10)
    assert woken == [True] * 4 and stop.is_set() and stop.wait() and stop.wait(0)
    with pytest.raises(TypeError, match="set once"):
        stop.clear()


def test_a_stop_signal_sets_it_names_itself_and_the_old_handlers_come_back() -> None:
    before = [signal.getsignal(sig) for sig in STOP_SIGNALS]
    stop, also = Stop(), Stop()
    with stop_on_signals(stop, also):
        os.kill(os.getpid(), signal.SIGINT)  # handled in this (the main) thread
        assert stop.wait(10) and also.is_set()
    assert (stop.signal, also.signal) == (signal.SIGINT, signal.SIGINT)
    assert [signal.getsignal(sig) for sig in STOP_SIGNALS] == before
