"""A call on a thread of its own, waited for with a deadline: for tests whose call may never return."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def call_in_thread(func: Callable[[], T], *, timeout: float, what: str) -> T:
    """``func()`` on a new daemon thread: what it returned, or the exception it raised, raised here.

    ``TimeoutError`` naming ``what`` if it has not returned within ``timeout`` seconds. The thread
    is a daemon, and so is every thread it starts (an application's worker lanes): a call that
    never returns (a statement sent to a hung server) fails its test, and cannot keep the
    interpreter from exiting, as a non-daemon thread or a ``ThreadPoolExecutor``'s would.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = func()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"call-in-thread: {what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
    if "error" in box:
        raise box["error"]
    return box["value"]
