"""A fleet of worker processes whose JSON events are read by background threads."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

Event = dict[str, Any]


class Fleet:
    """Start ``tests.procs`` workers through the ``spawn`` fixture and follow their events."""

    def __init__(self, spawn: Callable[..., subprocess.Popen[str]]) -> None:
        self.spawn = spawn
        self.events: queue.Queue[tuple[subprocess.Popen[str], Event]] = queue.Queue()
        self.procs: list[subprocess.Popen[str]] = []
        self.log: list[tuple[int, Event]] = []
        self.readers: list[threading.Thread] = []

    def start(self, *args: str) -> subprocess.Popen[str]:
        proc = self.spawn(*args)
        self.procs.append(proc)
        reader = threading.Thread(target=self._read, args=(proc,), daemon=True)
        reader.start()
        self.readers.append(reader)
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

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                self.events.put((proc, json.loads(line)))

    def next_event(self, timeout: float) -> tuple[subprocess.Popen[str], Event] | None:
        try:
            proc, event = self.events.get(timeout=timeout)
        except queue.Empty:
            return None
        self.log.append((proc.pid, event))
        return proc, event

    def wait_for(
        self, predicate: Callable[[subprocess.Popen[str], Event], bool], timeout: float
    ) -> tuple[subprocess.Popen[str], Event]:
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            got = self.next_event(remaining)
            if got and predicate(*got):
                return got
        raise AssertionError("expected worker event did not arrive in time")

    def alive(self) -> list[subprocess.Popen[str]]:
        return [p for p in self.procs if p.poll() is None]

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"worker {proc.pid} did not finish in time") from None
        for reader in self.readers:  # every line the workers printed is queued...
            reader.join(max(0.1, deadline - time.monotonic()))
        while self.next_event(0):  # ...and now logged
            pass

    def stderr_of_failures(self) -> str:
        return "\n".join((p.stderr.read() if p.stderr else "") for p in self.procs
                         if p.returncode not in (0, -9))
