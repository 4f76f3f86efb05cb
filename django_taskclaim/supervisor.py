"""``taskclaim_worker --processes P``: a supervisor of P worker processes, and the stop with a grace
that every worker process keeps.

The children are started with ``multiprocessing``'s *spawn* method: each is a fresh interpreter
that sets Django up and runs ``taskclaim_worker`` with the supervisor's options (``--processes 1``),
with its own database connections and nothing inherited from the supervisor (no connection, lock
or thread copied by a fork); spawn also works however the command was started (``manage.py``,
``django-admin``, ``python -m django``, ``call_command``), where re-executing the command line
would depend on it.

A child that dies is started again, after a delay that doubles while children die in quick
succession (0.5 s, 1 s, 2 s… up to 30 s; back to 0.5 s once one lived 30 s), so that a task
that kills its worker cannot make the supervisor spin. Each death and restart is logged with its
exit code or signal. A child that exits 0 by itself (``--until-drained``, ``--max-tasks``) is
done; the supervisor ends when every child is. A child that exits 2 before it became ready refused
its options (a usage error): the others are stopped, and the supervisor exits 2; one that exits 2
later (a task's ``sys.exit(2)`` or ``os._exit(2)``) died, and is started again like any other.

A sync task cannot be stopped: past its timeout it is fenced off (its attempt recorded ``TimedOut``)
but keeps its thread. A child whose sync task is still running ``--hard-timeout-grace`` seconds past
its timeout stops claiming, releases its spare claims uncharged, gives its other tasks that many
seconds more to finish, and exits with :data:`STUCK`; it is replaced like any child that died.

SIGTERM or SIGINT is forwarded to the children, which stop claiming, finish the tasks in hand
within the grace (``--grace``, default the lease), release what they reserved and did not start
(its attempt uncounted) and exit 0 (at once, exit hooks run then ``os._exit``, rather than after seconds of
interpreter teardown that the grace would count); then the supervisor exits 0. A child still running after the
grace is killed (:data:`OVERTIME` for the supervisor): its tasks come back when their leases
expire. A child outlives no supervisor: on Linux the kernel sends it SIGTERM when the supervisor
dies (``PR_SET_PDEATHSIG``), elsewhere it watches its parent's pid every second.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

from .stopping import STOP_SIGNALS, Stop, stop_on_signals

logger = logging.getLogger("django_taskclaim")

#: Exit code of a worker process (or a supervisor) that had to leave tasks in hand after its grace.
OVERTIME = 75
#: A supervisor kills a child this long after the grace, if the child did not exit by itself then.
KILL_MARGIN = 1.0
#: ``--hard-timeout-grace``'s default (seconds): a sync body that returns late but returns (a slow call)
#: costs no restart; one that never returns holds its slot a minute past its timeout, not for ever.
HARD_TIMEOUT_GRACE = 60.0
#: Exit code of a child that gave up a sync task stuck past its timeout plus ``--hard-timeout-grace``
#: (:func:`give_up_stuck`): a death like any other, the child replaced.
STUCK = 76
#: Usage errors (exit code 2) of a child that never became ready are not a death to restart after: the
#: child refused its options. Once ready (:func:`mark_ready`), an exit 2 is a death like any other (a task's).
USAGE_ERROR = 2
#: In a supervisor's child: the event it sets once it took its options and starts working.
_READY: Any = None


def supervised() -> bool:
    """Whether this process is a supervisor's child (a worker of ``--processes``)."""
    return _READY is not None


def give_up_stuck() -> None:
    """End this child with :data:`STUCK`: a sync task of its is stuck past its timeout plus the hard
    grace (its attempt was fenced off and recorded ``TimedOut`` at the timeout), and its thread can
    only end with the process. The supervisor starts another child in its place."""
    _leave(STUCK, lambda: None)  # the stuck thread's connection closes with the process


def mark_ready() -> None:
    """Tell the supervisor, if this process is one of its children, that the worker took its options
    and starts working: from here on an exit 2 is a death to restart after (a task's
    ``sys.exit(2)``, ``os._exit(2)``), not a refusal of its options."""
    if _READY is not None:
        _READY.set()


@contextlib.contextmanager
def graceful_stop(stop: Stop, grace: float) -> Iterator[None]:
    """While the block runs, SIGTERM and SIGINT set ``stop`` (the worker stops claiming, finishes
    what it holds, releases what it did not start); ``grace`` seconds after the first one, a
    process still busy exits with :data:`OVERTIME` at once, its tasks left to their leases.

    The handler only sets stops (:mod:`django_taskclaim.stopping`: a handler that takes a lock can
    wait for ever); the grace is counted by a thread that waits for the signal."""
    signalled, ended = Stop(), Stop()

    def count_the_grace() -> None:
        signalled.wait()
        if not ended.is_set() and not ended.wait(grace):
            _overtime(signalled.signal.name if signalled.signal else "a stop signal", grace)

    threading.Thread(target=count_the_grace, name="taskclaim-grace", daemon=True).start()
    try:
        with stop_on_signals(stop, signalled):
            # A supervisor's child blocks them while it sets up (run_child): one that came meanwhile
            # is handled now, and the worker stops before it claims anything.
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            yield
    finally:
        ended.set()
        signalled.set()  # the grace thread ends


def _overtime(signame: str, grace: float) -> None:
    logger.warning("worker %d still busy %g s after %s: exiting; its tasks in hand come back when their leases "
                   "expire", os.getpid(), grace, signame, extra={"grace": grace})
    for handler in logging.getLogger().handlers + logger.handlers:
        with contextlib.suppress(Exception):  # a flush must not keep the process from exiting
            handler.flush()
    os._exit(OVERTIME)


class Backoff:
    """The delay before a dead child is started again: ``first``, doubled at each death that
    follows a short life, up to ``cap``; ``first`` again after a child lived ``steady`` seconds."""

    def __init__(self, first: float = 0.5, cap: float = 30.0, steady: float = 30.0) -> None:
        self.first, self.cap, self.steady = first, cap, steady
        self.delay = 0.0

    def after(self, lived: float) -> float:
        """The delay before the restart of a child that died after ``lived`` seconds."""
        if lived >= self.steady or not self.delay:
            self.delay = self.first
        else:
            self.delay = min(self.delay * 2, self.cap)
        return self.delay


@dataclass
class _Slot:
    """One of the P places a child runs in."""

    number: int
    process: Any = None  # multiprocessing.Process, while one runs here
    started: float = 0.0
    restart_at: float | None = 0.0  # monotonic time to start the next child; None: done
    exits: list[int] = field(default_factory=list)
    ready: Any = None  # the event the child sets once it is ready to work (mark_ready)


def describe(code: int | None) -> str:
    """An exit code as people read it: ``exit code 1``, ``signal SIGKILL``."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    if code == STUCK:
        return f"exit code {code}: a sync task stuck past its timeout and --hard-timeout-grace"
    return f"exit code {code}"


def supervise(options: dict[str, Any], processes: int, grace: float,
              report: Callable[..., None] = lambda **event: None, backoff: Backoff | None = None) -> int:
    """Run ``processes`` children of ``taskclaim_worker`` with ``options`` (its ``handle()``'s
    keyword arguments) until each is done or a stop signal came and each stopped; the exit code
    (0, :data:`OVERTIME` when a child had to be killed or left tasks in hand, or a child's usage
    error). ``report(event=..., ...)`` is told each start, death and restart as they happen."""
    context = multiprocessing.get_context("spawn")
    backoff = backoff or Backoff()
    slots = [_Slot(n) for n in range(1, processes + 1)]
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    stopping: list[str] = []  # the signal's name, once one came
    kill_at = float("inf")
    code = 0
    told = False  # whether report() was told of the stop (not from the signal handler: it may interrupt a write)

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal kill_at
        if not stopping:
            stopping.append(signal.Signals(signum).name)
            kill_at = time.monotonic() + grace + KILL_MARGIN
        for slot in slots:  # each again on a second signal: a child not yet set up may have missed it
            if slot.process is not None and slot.process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.process.pid, signum)
        with contextlib.suppress(BlockingIOError):
            os.write(wake_w, b"\0")

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    logger.info("supervisor %d: %d worker processes, grace %g s", os.getpid(), processes, grace,
                extra={"processes": processes, "grace": grace})
    try:
        while True:
            now = time.monotonic()
            for slot in slots:
                if slot.process is None and not stopping and slot.restart_at is not None and slot.restart_at <= now:
                    _start(context, slot, options, report)
            if stopping and not told:
                told = True
                logger.info("supervisor %d: %s forwarded to the worker processes; grace %g s", os.getpid(),
                            stopping[0], grace, extra={"grace": grace})
                report(event="stopping", signal=stopping[0], grace=grace)
            running = [slot for slot in slots if slot.process is not None]
            if not running and (stopping or all(slot.restart_at is None for slot in slots)):
                break
            if stopping and now >= kill_at:
                for slot in running:
                    logger.warning("worker process %d still running %g s after %s: killing it; its tasks come "
                                   "back when their leases expire", slot.process.pid, grace, stopping[0],
                                   extra={"pid": slot.process.pid})
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(slot.process.pid, signal.SIGKILL)
                kill_at = float("inf")
            until = [kill_at] + [s.restart_at for s in slots if s.process is None and s.restart_at is not None
                                 and not stopping]
            timeout = max(0.0, min(until) - now) if min(until) != float("inf") else None
            wait([slot.process.sentinel for slot in running] + [wake_r], timeout)
            with contextlib.suppress(BlockingIOError):
                os.set_blocking(wake_r, False)
                os.read(wake_r, 64)
            for slot in running:
                if slot.process.exitcode is None:
                    continue
                result = _ended(slot, stopping, backoff, report)
                if result:
                    code = code or result
                    if result == USAGE_ERROR and not stopping:  # the options are wrong: stop the others
                        on_signal(signal.SIGTERM, None)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        for slot in slots:  # left by an error of the supervisor itself: they stop as on SIGTERM
            if slot.process is not None and slot.process.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.process.pid, signal.SIGTERM)
        os.close(wake_r)
        os.close(wake_w)
    report(event="supervisor_stopped", returncode=code)
    return code


def _start(context: Any, slot: _Slot, options: dict[str, Any], report: Callable[..., None]) -> None:
    ready = context.Event()
    process = context.Process(target=run_child, args=(options, os.getpid(), ready),
                              name=f"taskclaim-worker-{slot.number}", daemon=False)
    process.start()
    slot.process, slot.started, slot.ready = process, time.monotonic(), ready
    logger.info("worker process %d started (slot %d)", process.pid, slot.number,
                extra={"pid": process.pid, "slot": slot.number})
    report(event="worker_started", slot=slot.number, pid=process.pid)


def _ended(slot: _Slot, stopping: list[str], backoff: Backoff, report: Callable[..., None]) -> int:
    """Account for the child of ``slot`` that exited; the supervisor's exit code it calls for (0: none)."""
    process, exitcode = slot.process, slot.process.exitcode
    lived = time.monotonic() - slot.started
    slot.process = None
    slot.exits.append(exitcode)
    how = describe(exitcode)
    if stopping:
        clean = exitcode == 0 or exitcode in (-signal.SIGTERM, -signal.SIGINT)  # stopped before it set up
        (logger.info if clean else logger.warning)("worker process %d stopped (%s)", process.pid, how,
                                                   extra={"pid": process.pid, "exitcode": exitcode})
        report(event="worker_stopped", slot=slot.number, pid=process.pid, exitcode=exitcode, how=how)
        slot.restart_at = None
        return 0 if clean else OVERTIME
    if exitcode == 0:
        logger.info("worker process %d finished", process.pid, extra={"pid": process.pid})
        report(event="worker_finished", slot=slot.number, pid=process.pid)
        slot.restart_at = None
        return 0
    if exitcode == USAGE_ERROR and not slot.ready.is_set():  # before it was ready: its options, not a task
        logger.error("worker process %d refused its options (%s): not restarted", process.pid, how,
                     extra={"pid": process.pid, "exitcode": exitcode})
        report(event="worker_refused", slot=slot.number, pid=process.pid, exitcode=exitcode, how=how)
        slot.restart_at = None
        return USAGE_ERROR
    delay = backoff.after(lived)
    slot.restart_at = time.monotonic() + delay
    logger.warning("worker process %d died (%s) after %.1f s: restarting it in %g s", process.pid, how, lived, delay,
                   extra={"pid": process.pid, "exitcode": exitcode, "restart_in": delay})
    report(event="worker_died", slot=slot.number, pid=process.pid, exitcode=exitcode, how=how, lived=round(lived, 3),
           restart_in=delay)
    return 0


def run_child(options: dict[str, Any], parent: int, ready: Any = None) -> None:
    """A child's life: die with the supervisor, set Django up, run the worker command (which sets
    ``ready`` once it took its options: :func:`mark_ready`). From here
    the stop signals wait (blocked) until the worker can handle them (:func:`graceful_stop`),
    rather than kill a child half set up; one that comes earlier, while the interpreter starts
    (spawn's exec resets the signal mask), kills it before it claimed anything: the supervisor
    counts that as a clean stop."""
    global _READY
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    _die_with(parent)
    _READY = ready
    import django

    django.setup()
    from django.core.management import call_command
    from django.core.management.base import CommandError
    from django.db import connections

    code = 0
    try:
        call_command("taskclaim_worker", **options)
    except CommandError as exc:
        print(f"CommandError: {exc}", file=sys.stderr, flush=True)
        code = exc.returncode
    _leave(code, connections.close_all)


def _leave(code: int, close: Callable[[], None]) -> None:
    """Exit at once with ``code`` once the worker is done: its connections closed, the exit hooks
    run (``atexit``: a telemetry flush), its output and logs flushed. Not through the interpreter's
    teardown (multiprocessing's spawn ends with ``sys.exit``): tearing down Django's modules and
    collecting their objects takes seconds for processes sharing loaded cores, time in which a
    child that holds nothing any more would be counted busy by the supervisor and killed after
    the grace."""
    close()
    atexit._run_exitfuncs()  # what sys.exit would run first; only the teardown after them is skipped
    logging.shutdown()  # flushes every handler
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _die_with(parent: int) -> None:
    """Get SIGTERM when the supervisor dies (it then stops as on any SIGTERM): ``PR_SET_PDEATHSIG``
    on Linux (the kernel sends it, even after a SIGKILL of the supervisor), else a thread that
    watches the parent's pid."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(1, signal.SIGTERM, 0, 0, 0) == 0:  # PR_SET_PDEATHSIG = 1
                if os.getppid() != parent:  # it died before we asked
                    os.kill(os.getpid(), signal.SIGTERM)
                return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)  # a poll of the parent's pid: no event to wait for
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="taskclaim-parent-watch", daemon=True).start()
