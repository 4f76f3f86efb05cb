"""Waiting for a condition with a deadline: the one poll helper of tests, harness and demo."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], *, timeout: float, what: str, interval: float = 0.05) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy; return it.

    ``TimeoutError`` naming ``what`` once ``timeout`` seconds have passed. A poll of real state
    (a row, a file, a port), never a sleep standing in for an event.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
