"""The tasks of the I/O-bound phase (``benchmarks.iodrain_phase``): each waits, as a task that calls
a model or a remote service does, on a thread (``time.sleep``) or on an event loop
(``asyncio.sleep``). Bound to the ``default`` backend of whichever settings the process runs with,
like the no-op task of ``benchmarks.dtdb_tasks``, and imported under every system's interpreter.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

try:
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from django_tasks import task  # type: ignore[import-not-found,no-redef,unused-ignore]

from .dtdb_tasks import EXECUTED, noop

#: How often a held task looks for its gate (seconds): rare enough to cost nothing beside 500 others.
GATE_POLL = 0.25


@task()
def wait_sync(i: int, seconds: float) -> None:
    time.sleep(seconds)
    EXECUTED.append(i)


@task()
async def wait_async(i: int, seconds: float) -> None:
    await asyncio.sleep(seconds)
    EXECUTED.append(i)


@task()
async def hold_async(i: int, gate: str, cap: float) -> None:
    """Wait (on the event loop) until the file ``gate`` exists, ``cap`` seconds at most: a task in
    flight for as long as the driver measures the worker that holds it."""
    give_up = time.monotonic() + cap
    while not os.path.exists(gate) and time.monotonic() < give_up:
        await asyncio.sleep(GATE_POLL)
    EXECUTED.append(i)


#: The tasks a driver names (``tasks_runner prepare N KIND ARGS``): each takes the task's index first.
KINDS: dict[str, Any] = {"noop": noop, "sync": wait_sync, "async": wait_async, "hold": hold_async}
