"""JSON-lines events: children ``emit`` one object per line on stdout, parents read them back."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import IO, Any

Event = dict[str, Any]


_EMITTING = threading.Lock()


def emit(**event: Any) -> None:
    """Print ``event`` as one JSON line on stdout and flush, so a parent sees it at once (whole
    lines, whichever thread of a worker running several tasks at once emits it)."""
    line = json.dumps(event, default=str) + "\n"
    with _EMITTING:
        sys.stdout.write(line)
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
    """Events read from several streams on background threads, kept in ``log`` in arrival order.

    Each event is tagged with a ``source`` the caller chooses (a process, a name). The log only
    grows; readers go through it forward, each from a place of its own (a ``Cursor``), so one
    caller following every source and another waiting for one source's next event never take
    events from each other. ``stamp`` names a key under which each event gets its arrival time
    (``time.time()``), for a caller that compares events with another clock.
    """

    def __init__(self, stamp: str | None = None) -> None:
        self.log: list[tuple[Any, Event]] = []
        self.threads: list[threading.Thread] = []
        self.stamp = stamp
        self.changed = threading.Condition()  # re-entrant: a cursor asks ended() while holding it
        self._ended: set[int] = set()  # id() of the sources whose stream was read to its end

    def follow(self, stream: IO[str], source: Any) -> None:
        thread = threading.Thread(target=self._read, args=(stream, source), daemon=True)
        thread.start()
        self.threads.append(thread)

    def _read(self, stream: IO[str], source: Any) -> None:
        try:
            for line in stream:  # line by line, as the child writes them
                event = parse_line(line)
                if event is not None:
                    if self.stamp:
                        event[self.stamp] = time.time()
                    with self.changed:
                        self.log.append((source, event))
                        self.changed.notify_all()
        except (OSError, ValueError):  # the stream was closed under us: the child is being cleaned up
            pass
        finally:
            with self.changed:
                self._ended.add(id(source))
                self.changed.notify_all()

    def ended(self, source: Any, timeout: float = 0) -> bool:
        """Whether ``source``'s stream was read to its end (every event it wrote is in the log),
        waiting up to ``timeout`` seconds for that."""
        with self.changed:
            return self.changed.wait_for(lambda: id(source) in self._ended, timeout)

    def cursor(self, source: Any = None) -> Cursor:
        """A place of its own at the start of the log; with ``source``, it sees that source's events only."""
        return Cursor(self, source)

    def drain(self, timeout: float) -> list[tuple[Any, Event]]:
        """Wait for the streams to end (up to ``timeout``), then the whole log."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return self.log


class Cursor:
    """A place in an ``EventReader``'s log, read forward: each event once, in arrival order."""

    def __init__(self, reader: EventReader, source: Any = None) -> None:
        self.reader, self.source, self.at = reader, source, 0

    def next(self, timeout: float) -> tuple[Any, Event] | None:
        """The next event within ``timeout`` seconds; None after that, or at once when this
        cursor's source has ended and nothing of it is left."""
        deadline = time.monotonic() + timeout
        reader = self.reader
        with reader.changed:
            while True:
                while self.at < len(reader.log):
                    got = reader.log[self.at]
                    self.at += 1
                    if self.source is None or got[0] is self.source:
                        return got
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.source is not None and reader.ended(self.source)):
                    return None
                reader.changed.wait(remaining)

    def wait_for(self, predicate: Callable[[Any, Event], bool], *, timeout: float,
                 what: str = "an event") -> tuple[Any, Event]:
        """The next event for which ``predicate(source, event)`` holds, passing the others.

        ``TimeoutError`` naming ``what`` after ``timeout`` seconds; ``AssertionError`` when this
        cursor's source ended without it.
        """
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            got = self.next(remaining)
            if got is None and self.source is not None and self.reader.ended(self.source):
                raise AssertionError(f"{what}: the output ended without it")
            if got and predicate(*got):
                return got
        raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
