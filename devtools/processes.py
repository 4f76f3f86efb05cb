"""Child processes (``python -m MODULE args``) for the tests, the fault-injection harness and the demo.

One helper starts them, reads their JSON-line events (``devtools.events.emit``), signals them
(SIGKILL, SIGSTOP, SIGCONT) and waits for them with a deadline. ``Supervisor`` is a context
manager that kills whatever is still running when it exits, so a failing test or an interrupted
run leaves no processes behind. A wait past its deadline raises ``TimeoutError`` naming what it
waited for (as ``devtools.polling.wait_until`` does); a child that ended without the event
waited for raises ``AssertionError`` with its stderr.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, Self

from . import forkserver
from .events import Event, EventReader


def state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``T`` stopped, ``S`` sleeping, ``Z`` a zombie), or ``gone``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return stat[stat.rindex(")") + 2]


def send(pid: int, signum: int, *, group: bool = False) -> bool:
    """Send ``signum`` to process ``pid`` (to its whole process group with ``group``); False if it is gone.

    For processes a ``Child`` does not stand for, such as the pool processes of a Celery worker.
    """
    try:
        if group:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


class Child:
    """One started process: its events, its signals, its exit, and its stderr kept in a file (no pipe to fill)."""

    def __init__(self, proc: subprocess.Popen[str], stderr: IO[bytes], events: EventReader, group: bool) -> None:
        self.proc = proc
        self.group = group  # signals go to the process group it leads
        self._stderr = stderr
        self._reader = events
        self._events = events.cursor(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, line: str) -> bool:
        """Write one line to the child's stdin; False if the child no longer reads it (it exited)."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line.rstrip("\n") + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):  # a broken pipe, or stdin already closed
            return False
        return True

    def end_input(self) -> None:
        """Close the child's stdin: a child reading it line by line sees its end."""
        with contextlib.suppress(OSError):  # a broken pipe to a child that exited
            if self.proc.stdin is not None:
                self.proc.stdin.close()

    def signal(self, signum: int) -> bool:
        """Send ``signum`` while the child runs (never to a reaped pid, which may be another process's now)."""
        return self.alive() and send(self.pid, signum, group=self.group)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def stop(self) -> None:
        """SIGSTOP: the process freezes where it is (a long GC pause, a descheduled VM)."""
        self.signal(signal.SIGSTOP)

    def cont(self) -> None:
        self.signal(signal.SIGCONT)

    def wait(self, timeout: float) -> int:
        """The exit code; ``TimeoutError`` if the child still runs after ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"process {self.pid} did not exit within {timeout:g} s") from None

    def event(self, name: str | None = None, *, timeout: float) -> Event:
        """The child's next event (its next one named ``name``, when given, passing the others)."""
        what = f"{name or 'an event'} from process {self.pid}"
        try:
            return self._events.wait_for(lambda _, e: name is None or e.get("event") == name,
                                         timeout=timeout, what=what)[1]
        except AssertionError:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)  # its output ended: it is exiting, say with which code
            raise AssertionError(f"process {self.pid} exited with code {self.returncode} before {what}; "
                                 f"its stderr:\n{self.stderr()}") from None

    @property
    def events(self) -> list[Event]:
        """Every event of this child read so far, in order."""
        with self._reader.changed:
            return [e for c, e in self._reader.log if c is self]

    def ended(self, timeout: float = 0) -> bool:
        """Whether the child's output has ended (it exited, and every event it wrote is in the log),
        waiting up to ``timeout`` seconds for that."""
        return self._reader.ended(self, timeout)

    def finish(self, timeout: float) -> Event:
        """Wait for the child to exit with code 0 (``AssertionError`` with its stderr otherwise); its last event."""
        deadline = time.monotonic() + timeout
        code = self.wait(timeout)
        self.ended(max(0.1, deadline - time.monotonic()))  # the last lines may still be on their way
        events = self.events
        if code != 0 or not events:
            raise AssertionError(f"process {self.pid} exited with code {code}"
                                 f"{'' if events else ' and wrote no event'}; its stderr:\n{self.stderr()}")
        return events[-1]

    def stderr(self) -> str:
        """What the child wrote on stderr so far (read without moving the file offset it writes at)."""
        fd = self._stderr.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def close(self) -> None:
        # stdout once read to its end only: closing it under the reading thread would wait for that read.
        for stream in (self.proc.stdin, self.proc.stdout if self.ended(5) else None):
            if stream is not None:
                with contextlib.suppress(OSError):  # a broken pipe to a killed child
                    stream.close()
        self._stderr.close()


class Supervisor:
    """Start children and follow their events; kill leftovers on exit (SIGCONT first: a stopped child dies too).

    ``next``/``wait_for`` read every child's events in arrival order, from the supervisor's own
    place in the log; ``Child.event`` reads one child's from its own place: neither takes
    events from the other.
    """

    def __init__(self, *, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
                 python: str = sys.executable, stamp: str | None = None) -> None:
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd
        self.python = python
        self.children: list[Child] = []
        self.events = EventReader(stamp)
        self._events = self.events.cursor()  # the supervisor's own place: every child's events

    def start(self, module: str, *args: str, env: Mapping[str, str] | None = None, group: bool = False,
              stderr: str | Path | None = None) -> Child:
        """Run ``python -m module args`` with stdin and stdout piped; its events are followed at once.

        ``env`` adds to the supervisor's environment. ``group``: the child leads a process group
        of its own, and its signals go to the whole group (a Celery worker and its pool).
        ``stderr``: a file to keep the child's stderr in (default: a temporary file).
        """
        err = open(stderr, "w+b") if stderr is not None else tempfile.TemporaryFile()  # noqa: SIM115 (closed by Child.close)
        full_env = {**self.env, **(env or {})}
        proc: Any = forkserver.start(self.python, full_env, self.cwd, module, list(args), group=group, stderr=err)
        if proc is None:
            proc = subprocess.Popen(
                [self.python, "-m", module, *args], env=full_env, cwd=self.cwd,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, errors="replace",
                start_new_session=group,
            )
        child = Child(proc, err, self.events, group)
        self.children.append(child)
        assert proc.stdout is not None
        self.events.follow(proc.stdout, child)
        return child

    def go(self, *children: Child, timeout: float = 60) -> list[Event]:
        """Wait for each child's ``ready`` event, then write ``go`` to every one (all children when
        none is named): released together, each already connected and set up. The ``ready``
        events, in the children's order."""
        children = children or tuple(self.children)
        ready = [child.event("ready", timeout=timeout) for child in children]
        for child in children:
            child.send("go")
        return ready

    @property
    def log(self) -> list[tuple[Child, Event]]:
        """Every event read so far, with its child, in arrival order."""
        return self.events.log

    def next(self, timeout: float) -> tuple[Child, Event] | None:
        """The next event of any child within ``timeout`` seconds, or None."""
        return self._events.next(timeout)

    def wait_for(self, predicate: Callable[[Child, Event], bool], *, timeout: float,
                 what: str = "a child's event") -> tuple[Child, Event]:
        """The next event for which ``predicate(child, event)`` holds, passing the others."""
        return self._events.wait_for(predicate, timeout=timeout, what=what)

    def alive(self) -> list[Child]:
        return [c for c in self.children if c.alive()]

    def join(self, timeout: float) -> list[tuple[Child, Event]]:
        """Wait for every child to exit and every event to be read; the whole event log."""
        deadline = time.monotonic() + timeout
        for child in self.children:
            child.wait(max(0.1, deadline - time.monotonic()))
        return self.events.drain(max(0.1, deadline - time.monotonic()))

    def failures(self, ok: tuple[int, ...] = (0, -signal.SIGKILL)) -> str:
        """The stderr of children that exited with a code outside ``ok``."""
        return "\n".join(f"process {c.pid} exited with code {c.returncode}:\n{c.stderr()}" for c in self.children
                         if c.returncode is not None and c.returncode not in ok)

    def close(self) -> None:
        for child in self.children:
            if child.alive():
                child.cont()
                child.kill()
        for child in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(10)
            child.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
