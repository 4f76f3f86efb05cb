"""A fleet of worker processes whose JSON events are read by background threads."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

from devtools.events import EventReader

Event = dict[str, Any]


class Fleet:
    """Start ``tests.programs.claimer`` workers through the ``spawn`` fixture and follow their events."""

    def __init__(self, spawn: Callable[..., subprocess.Popen[str]]) -> None:
        self.spawn = spawn
        self.reader = EventReader()
        self.procs: list[subprocess.Popen[str]] = []

    @property
    def log(self) -> list[tuple[int, Event]]:
        return [(proc.pid, event) for proc, event in self.reader.log]

    def start(self, *args: str) -> subprocess.Popen[str]:
        proc = self.spawn(*args)
        self.procs.append(proc)
        assert proc.stdout is not None
        self.reader.follow(proc.stdout, proc)
        return proc

    def go(self, timeout: float = 60) -> None:
        """Wait until every worker said ready, then release them all at once (``--go`` workers)."""
        ready: set[int] = set()
        while len(ready) < len(self.procs):
            proc, _ = self.wait_for(lambda p, e: e["event"] == "ready" and p.pid not in ready, timeout)
            ready.add(proc.pid)
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def next_event(self, timeout: float) -> tuple[subprocess.Popen[str], Event] | None:
        return self.reader.next(timeout)

    def wait_for(
        self, predicate: Callable[[subprocess.Popen[str], Event], bool], timeout: float
    ) -> tuple[subprocess.Popen[str], Event]:
        got: tuple[subprocess.Popen[str], Event] = self.reader.wait_for(
            predicate, timeout=timeout, what="an expected worker event")
        return got

    def alive(self) -> list[subprocess.Popen[str]]:
        return [p for p in self.procs if p.poll() is None]

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"worker {proc.pid} did not finish in time") from None
        self.reader.drain(max(0.1, deadline - time.monotonic()))  # every line the workers printed

    def stderr_of_failures(self) -> str:
        return "\n".join((p.stderr.read() if p.stderr else "") for p in self.procs
                         if p.returncode not in (0, -9))
