"""Where each schedule stands: its newest tick with a task (and that task), its next tick, and
its lag. What the admin's schedules page and the ``taskclaim_schedule_lag_seconds`` gauge show."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .firing import newest_fired
from .spec import Schedule


@dataclass(frozen=True)
class Standing:
    schedule: Schedule
    last_tick: datetime | None
    last_task: Any  # the last tick's Task, or None
    next_tick: datetime | None
    lag: float  # seconds


def standing(schedule: Schedule, now: datetime | None = None) -> Standing:
    """``schedule`` at ``now``: its newest tick with a task, the next tick, and the lag.

    The lag is how long the oldest tick that is due but has no task has waited: the first tick
    after the newest fired one, when it is due (0 when nothing due is missing). A schedule whose
    schedulers all stopped grows its lag by a second each second; an enqueued tick waiting for a
    worker is the queue's lag (``taskclaim_queue_oldest_due_seconds``), not the schedule's.
    """
    from ..models import Task
    from .firing import _database

    now = now or datetime.now(UTC)
    last = newest_fired(schedule, now)
    task = None
    if last is not None:
        task = Task.objects.using(_database()).filter(tenant="", key=schedule.key(last)).first()
    missing = schedule.next_after(last) if last is not None else None
    lag = max(0.0, (now - missing).total_seconds()) if missing is not None and missing <= now else 0.0
    return Standing(schedule, last, task, schedule.next_after(now), lag)
