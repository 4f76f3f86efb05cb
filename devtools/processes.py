"""Supervise child processes (``python -m MODULE args``): start, signal, wait with a deadline, read events.

``Supervisor`` is a context manager that kills whatever is still running when it exits, so a
failing test or an interrupted benchmark leaves no processes behind.
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
from typing import IO, Any, Self

from .events import Event, EventReader


class Child:
    """One supervised process: its ``Popen``, and its stderr kept in a temporary file (no pipe to fill)."""

    def __init__(self, proc: subprocess.Popen[str], stderr: IO[str] | None = None) -> None:
        self.proc = proc
        self._stderr = stderr  # None: stderr is the Popen's pipe

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, line: str) -> None:
        """Write one line to the child's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.rstrip("\n") + "\n")
        self.proc.stdin.flush()

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def stop(self) -> None:
        """SIGSTOP: the process freezes where it is (a long GC pause, a descheduled VM)."""
        self.signal(signal.SIGSTOP)

    def cont(self) -> None:
        self.signal(signal.SIGCONT)

    def wait(self, timeout: float) -> int:
        """The exit code; AssertionError if the child is still running after ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"process {self.pid} did not exit within {timeout}s") from None

    def stderr(self) -> str:
        if self._stderr is None:
            return self.proc.stderr.read() if self.proc.stderr else ""
        self._stderr.flush()
        self._stderr.seek(0)
        return self._stderr.read()

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):  # a broken pipe to a killed child
                    stream.close()
        if self._stderr is not None:
            self._stderr.close()


class Supervisor:
    """Start children, follow their JSON-line events (``events``), and kill leftovers on exit."""

    def __init__(self, *, env: Mapping[str, str] | None = None, cwd: str | None = None,
                 python: str = sys.executable) -> None:
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd
        self.python = python
        self.children: list[Child] = []
        self.events = EventReader()

    def start(self, module: str, *args: str, env: Mapping[str, str] | None = None) -> Child:
        """Run ``python -m module args`` with stdin and stdout piped; ``env`` adds to the supervisor's."""
        stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed by Child.close)
        proc = subprocess.Popen(
            [self.python, "-m", module, *args], env={**self.env, **(env or {})}, cwd=self.cwd,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
        )
        child = Child(proc, stderr)
        self.children.append(child)
        assert proc.stdout is not None
        self.events.follow(proc.stdout, child)
        return child

    def popen(self, module: str, *args: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        """Run ``python -m module args`` with stdin, stdout and stderr piped, for a caller that reads them itself.

        Nothing follows its events; it is still killed when the supervisor closes.
        """
        proc = subprocess.Popen(
            [self.python, "-m", module, *args], env={**self.env, **(env or {})}, cwd=self.cwd,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.children.append(Child(proc))
        return proc

    def alive(self) -> list[Child]:
        return [c for c in self.children if c.alive()]

    def wait_for(self, predicate: Callable[[Child, Event], bool], *, timeout: float,
                 what: str = "a child's event") -> tuple[Child, Event]:
        """The next event for which ``predicate(child, event)`` holds (AssertionError after ``timeout``)."""
        got: tuple[Child, Event] = self.events.wait_for(predicate, timeout=timeout, what=what)
        return got

    def event_of(self, child: Child, name: str, *, timeout: float) -> Event:
        """The next ``{"event": name}`` from ``child``."""
        return self.wait_for(lambda c, e: c is child and e.get("event") == name,
                             timeout=timeout, what=f"{name!r} from process {child.pid}")[1]

    def join(self, timeout: float) -> list[tuple[Child, Event]]:
        """Wait for every child to exit and every event to be read; the whole event log."""
        deadline = time.monotonic() + timeout
        for child in self.children:
            child.wait(max(0.1, deadline - time.monotonic()))
        return self.events.drain(max(0.1, deadline - time.monotonic()))

    def failures(self, ok: tuple[int, ...] = (0, -signal.SIGKILL)) -> str:
        """The stderr of children that exited with a code outside ``ok``."""
        return "\n".join(c.stderr() for c in self.children
                         if c.returncode is not None and c.returncode not in ok)

    def close(self) -> None:
        for child in self.children:
            if child.alive():
                child.cont()  # a stopped process still dies of SIGKILL, but resume it for clarity
                child.kill()
        for child in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(10)
            child.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
