"""Where a test run that does not end waits: its threads' stacks on a signal, and the threads a
test left running that the interpreter would wait for at exit.

Standard library only. ``tests/conftest.py`` installs both in the pytest process; the test runner
(``tests/__main__.py``) sends ``SIGUSR1`` to a run past its deadline before it stops it.
"""

from __future__ import annotations

import faulthandler
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import thread as futures_thread

#: Signals on which every thread's stack is written (SIGTERM: then the process ends as before).
DUMP_SIGNALS = {signal.SIGUSR1: False, signal.SIGTERM: True}  # signal -> chain to its default action


def dump_on_signals(fd: int) -> None:
    """Write every thread's stack to file descriptor ``fd`` on ``SIGUSR1`` (the process goes on)
    and on ``SIGTERM`` (then it ends, as it would have): a run stopped from outside says where it was."""
    for signum, chain in DUMP_SIGNALS.items():
        faulthandler.register(signum, file=fd, all_threads=True, chain=chain)


def threads_left(timeout: float) -> list[threading.Thread]:
    """The non-daemon threads (the main one aside) still running after waiting up to ``timeout``
    seconds for them to end: the interpreter waits for these at exit, for ever if they never end."""
    deadline = time.monotonic() + timeout
    # A concurrent.futures worker (asgiref's, a test's executor) is told to end by that module's own
    # exit hook, which runs before the interpreter waits for threads: an idle one is no hang.
    executors = set(getattr(futures_thread, "_threads_queues", {}).keys())
    left = [t for t in threading.enumerate()
            if t is not threading.main_thread() and not t.daemon and t not in executors]
    for thread in left:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t for t in left if t.is_alive()]


def stacks(threads: list[threading.Thread]) -> str:
    """The current stack of each of ``threads``, most recent call last."""
    frames = sys._current_frames()
    parts = []
    for thread in threads:
        frame = frames.get(thread.ident or -1)
        where = "".join(traceback.format_stack(frame)) if frame is not None else "  (no frame)\n"
        parts.append(f"thread {thread.name!r} (ident {thread.ident}):\n{where}")
    return "\n".join(parts)
