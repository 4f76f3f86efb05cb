"""JSON-lines events: children ``emit`` one object per line on stdout, parents read them back."""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import IO, Any

Event = dict[str, Any]


def emit(**event: Any) -> None:
    """Print ``event`` as one JSON line on stdout and flush, so a parent sees it at once."""
    sys.stdout.write(json.dumps(event, default=str) + "\n")
    sys.stdout.flush()


def parse_line(line: str) -> Event | None:
    """The event on ``line``, or None for a line that is not a whole JSON object (a log, a line cut by a kill)."""
    if not line.startswith("{"):
        return None
    try:
        event: Event = json.loads(line)
    except json.JSONDecodeError:
        return None
    return event


def parse(lines: Iterable[str]) -> list[Event]:
    """The events among ``lines``, in order."""
    return [e for e in map(parse_line, lines) if e is not None]


class EventReader:
    """Read events from several streams on background threads into one queue, in arrival order.

    Each event is tagged with a ``source`` the caller chooses (a process, a name), and every
    event taken from the queue is kept in ``log``.
    """

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[Any, Event]] = queue.Queue()
        self.log: list[tuple[Any, Event]] = []
        self.threads: list[threading.Thread] = []

    def follow(self, stream: IO[str], source: Any) -> None:
        thread = threading.Thread(target=self._read, args=(stream, source), daemon=True)
        thread.start()
        self.threads.append(thread)

    def _read(self, stream: IO[str], source: Any) -> None:
        for line in stream:  # line by line, as the child writes them
            event = parse_line(line)
            if event is not None:
                self.queue.put((source, event))

    def next(self, timeout: float) -> tuple[Any, Event] | None:
        """The next event within ``timeout`` seconds, or None."""
        try:
            got = self.queue.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        self.log.append(got)
        return got

    def wait_for(self, predicate: Callable[[Any, Event], bool], *, timeout: float,
                 what: str = "an event") -> tuple[Any, Event]:
        """The first next event for which ``predicate(source, event)`` holds; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            got = self.next(remaining)
            if got and predicate(*got):
                return got
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")

    def drain(self, timeout: float) -> list[tuple[Any, Event]]:
        """Wait for the readers to reach end of stream (up to ``timeout``), then log what is queued."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        while self.next(0):
            pass
        return self.log
