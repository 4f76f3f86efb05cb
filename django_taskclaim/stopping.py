"""Stopping a long loop on SIGTERM/SIGINT: the one signal-handling helper of the worker, the
scheduler, the relay and the reclaim loop.

A Python signal handler runs in the main thread between two bytecodes, possibly while that thread
is inside ``threading.Event.wait()`` holding the event's lock: a handler that calls
``Event.set()`` then waits for that lock for ever, and the process never exits (issue 40, item 16;
the same for ``threading.Timer.start()``). So a handler here takes no lock: it sets a flag and
writes a byte to a pipe, and :meth:`Stop.wait` is a ``poll()`` on that pipe.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

#: The longest single poll() (seconds): its timeout is an int of milliseconds.
_LONGEST_POLL = 86400.0
#: The signals that stop a loop gracefully.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

__all__ = ["STOP_SIGNALS", "Stop", "stop_on_signals"]


class Stop(threading.Event):
    """A stop that may be set from a signal handler: an ``Event`` (``set``, ``is_set``, ``wait``)
    whose ``set()`` takes no lock. ``wait()`` polls a pipe that ``set()`` writes once and nobody
    reads, so it stays readable: any number of threads wait on it, before or after it was set.
    ``signal``: the first stop signal that set it, if one did."""

    def __init__(self) -> None:
        super().__init__()
        self._stopped = False
        self.signal: signal.Signals | None = None
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        weakref.finalize(self, _close, self._read, self._write)

    def set(self) -> None:
        """Set it (from any thread, or a signal handler): every ``wait()`` returns ``True``."""
        if not self._stopped:
            self._stopped = True
            with contextlib.suppress(OSError):  # full (it cannot be: one byte) or closed at exit
                os.write(self._write, b"\0")

    def is_set(self) -> bool:
        return self._stopped

    def wait(self, timeout: float | None = None) -> bool:
        """Until set, at most ``timeout`` seconds (``None``: no limit); whether it is set. A signal
        that comes meanwhile runs its handler and the poll goes on (PEP 475)."""
        if self._stopped:
            return True
        poller = select.poll()
        poller.register(self._read, select.POLLIN)
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while not self._stopped:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            # poll() takes at most about 24 days (an int of milliseconds): a longer wait is several.
            poller.poll(None if left is None else min(left, _LONGEST_POLL) * 1000.0)
        return self._stopped

    def clear(self) -> None:
        raise TypeError("a Stop is set once: make a new one")

    def __repr__(self) -> str:
        return f"<Stop {'set' if self._stopped else 'unset'}>"


def _close(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


@contextlib.contextmanager
def stop_on_signals(stop: Stop, *also: Stop) -> Iterator[Stop]:
    """While the block runs, SIGTERM and SIGINT set ``stop`` (and ``also``), and do nothing else;
    the handlers that were there before are back afterwards. In the main thread, as
    ``signal.signal``. A handler takes no lock: what else a stop needs (a timer, a log line) runs
    in a thread that waits on it."""
    stops = (stop, *also)

    def handler(signum: int, frame: Any) -> None:
        for each in stops:
            if each.signal is None:
                each.signal = signal.Signals(signum)
            each.set()

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
