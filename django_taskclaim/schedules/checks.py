"""The system checks of ``TASKCLAIM_SCHEDULES``: each schedule's problems, named by schedule and field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core import checks

from ..checkspec import spec
from ..conf import settings
from .spec import CronsimMissing, ScheduleError, parse, schedules, task_problem

E301 = spec("django_taskclaim.E301", "{problem}",
            "Fix the schedule: its keys are task or queue, cron or every, timezone, args and kwargs (a task) "
            "or payload (a queue), catch_up (latest, all, skip) and catch_up_limit; see docs/django-tasks.md.")
E302 = spec("django_taskclaim.E302", "{problem}",
            "Write a cron expression of five fields (minute hour day month weekday), or six with seconds "
            "first, e.g. '*/5 * * * *'; or use 'every' (seconds).")
E303 = spec("django_taskclaim.E303", "{problem}",
            "Name an IANA timezone (zoneinfo), e.g. 'UTC' or 'Europe/Paris'; install tzdata where the system "
            "has no timezone database.")
E304 = spec("django_taskclaim.E304", "TASKCLAIM_SCHEDULES[{name!r}]['task']: {problem}.",
            "Give the dotted path of a function declared with @task() whose backend is a "
            "django_taskclaim.tasks.ClaimBackend.")
E305 = spec("django_taskclaim.E305", "{problem}",
            "pip install 'django-taskclaim[schedules]' (cronsim), or use 'every' (seconds) instead of 'cron'.")

_BY_KIND = {"cron": E302, "timezone": E303}


def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every problem of every schedule (not only the first schedule's)."""
    raw = settings.SCHEDULES
    if not raw:
        return []
    if not isinstance(raw, Mapping):
        return [E301.error(problem=f"TASKCLAIM_SCHEDULES must be a dict of schedules, not {type(raw).__name__}")]
    found: list[checks.CheckMessage] = []
    for name, entry in raw.items():
        try:
            schedule = parse(name, entry)
        except CronsimMissing as exc:
            found.append(E305.error(problem=str(exc)))
            continue
        except ScheduleError as exc:
            found.append(_BY_KIND.get(exc.kind, E301).error(problem=str(exc)))
            continue
        problem = task_problem(schedule)
        if problem is not None:
            found.append(E304.error(name=schedule.name, problem=problem))
    if not found:
        try:
            schedules(raw)  # what spans schedules: names that differ only in case
        except ScheduleError as exc:
            found.append(E301.error(problem=str(exc)))
    return found


def register() -> None:
    checks.register(check_schedules)
