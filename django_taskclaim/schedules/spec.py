"""``TASKCLAIM_SCHEDULES``: each schedule read and checked, and its ticks (UTC instants).

A schedule is a cron expression (evaluated in the schedule's timezone by ``cronsim``, imported
only when a cron schedule is used) or a fixed interval (``every`` seconds, aligned to the Unix
epoch, so that every scheduler computes the same ticks without talking to the others).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..identity import TaskKey

LATEST, ALL, SKIP = "latest", "all", "skip"
CATCH_UP = (LATEST, ALL, SKIP)
#: How many missed ticks ``catch_up: "all"`` fires at most (the newest ones): ``catch_up_limit``'s default.
CATCH_UP_LIMIT = 100
KEYS = frozenset({"task", "queue", "payload", "cron", "every", "timezone", "args", "kwargs", "catch_up",
                  "catch_up_limit"})
#: A schedule's name: it goes into every tick's key (``schedule:<name>``).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}")
#: A tick's time in its key: fixed width, so that keys of one schedule sort in time order.
TICK_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


class ScheduleError(ValueError):
    """A schedule that cannot be used; the message names the schedule and the field."""

    def __init__(self, name: str, field: str, problem: str, *, kind: str = "") -> None:
        where = f"TASKCLAIM_SCHEDULES[{name!r}]" + (f"[{field!r}]" if field else "") if name else ""
        super().__init__(f"{where}: {problem}" if where else problem)
        #: ``kind``: "cron" (an expression cronsim refuses), "timezone" (an unknown zone), else "".
        self.name, self.field, self.problem, self.kind = name, field, problem, kind


@dataclass(frozen=True)
class Schedule:
    """One entry of ``TASKCLAIM_SCHEDULES``, checked: what it enqueues and when."""

    name: str
    task: str = ""  # the dotted path of a @task() (a Django task)…
    queue: str = ""  # …or the queue of a handler worker's work
    payload: Any = None  # the handler's work (with ``queue``)
    cron: str = ""
    every: int = 0
    timezone: str = "UTC"
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    catch_up: str = LATEST
    catch_up_limit: int = CATCH_UP_LIMIT

    # -- identity ---------------------------------------------------------------------------
    @property
    def operation(self) -> str:
        return "schedule:" + self.name

    def key(self, tick: datetime) -> str:
        """The tick's identity: ``TaskKey("schedule:" + name, run=<tick, ISO 8601 UTC>)``."""
        return TaskKey(self.operation, run=tick.astimezone(UTC).strftime(TICK_FORMAT)).key

    def tick_of(self, key: str) -> datetime | None:
        """The tick a key of this schedule names (``None``: a key of something else)."""
        suffix = self.suffix
        if not key.endswith(suffix):
            return None
        try:
            tick = datetime.strptime(key[: -len(suffix)].replace("%3A", ":"), TICK_FORMAT).replace(tzinfo=UTC)
        except ValueError:
            return None
        return tick if self.key(tick) == key else None

    @property
    def suffix(self) -> str:
        """What every tick key of this schedule ends with: ``:`` and the escaped operation (a key
        without a run starts with the separator)."""
        return TaskKey(self.operation).key

    # -- ticks ------------------------------------------------------------------------------
    def after(self, moment: datetime) -> Iterator[datetime]:
        """The ticks strictly after ``moment``, in order, as aware UTC datetimes."""
        moment = moment.astimezone(UTC)
        if self.every:
            epoch = int(moment.timestamp()) // self.every * self.every + self.every
            while True:
                yield datetime.fromtimestamp(epoch, UTC)
                epoch += self.every
        from cronsim import CronSim  # the optional extra "schedules": only a cron schedule needs it

        # cronsim follows cron through DST changes (docs/django-tasks.md, "Schedules"): a time of a
        # gap fires once at the gap's end for an expression naming the hour, a repeated hour once
        # (its first pass); an expression of every hour fires by elapsed time (both passes).
        for tick in CronSim(self.cron, moment.astimezone(ZoneInfo(self.timezone)).replace(microsecond=0)):
            tick = tick.astimezone(UTC)
            if tick > moment:
                yield tick

    def due(self, since: datetime, now: datetime, limit: int) -> list[datetime]:
        """The ticks after ``since`` up to ``now`` (included), the newest ``limit`` of them."""
        found: list[datetime] = []
        for tick in self.after(since):
            if tick > now:
                break
            found.append(tick)
            if len(found) > limit:
                del found[0]
        return found

    def latest(self, now: datetime, back: int) -> list[datetime]:
        """The newest ``back`` ticks at or before ``now``, oldest first (fewer where a cron
        expression has none in the last ``back`` × 400 days)."""
        if self.every:
            last = int(now.timestamp()) // self.every * self.every
            return [datetime.fromtimestamp(last - i * self.every, UTC) for i in range(back - 1, -1, -1)]
        from cronsim import CronSim

        # cronsim's reverse walk can skip a tick next to a repeated hour (from 02:00:02 CET on
        # 2026-10-25 it misses 02:30 CEST), so it only finds where to start: the ticks themselves
        # are the forward walk's, the one that fires them (after()), from a few hours earlier.
        start = (now + timedelta(seconds=1)).astimezone(ZoneInfo(self.timezone)).replace(microsecond=0)
        earliest = now
        for count, tick in enumerate(CronSim(self.cron, start, reverse=True), 1):
            earliest = min(earliest, tick.astimezone(UTC))
            if count > back or now - earliest > timedelta(days=400 * back):
                break
        return self.due(earliest - timedelta(hours=3), now, back)

    def next_after(self, moment: datetime) -> datetime | None:
        return next(iter(self.after(moment)), None)


def parse(name: object, entry: object) -> Schedule:
    """One entry of ``TASKCLAIM_SCHEDULES`` as a ``Schedule``; ``ScheduleError`` naming the first problem.

    It does not import the task (``task_problem`` does, for the system check and the scheduler)."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ScheduleError(str(name), "", "a schedule's name is 1 to 100 letters, digits, '_', '.' or '-', "
                            "starting with a letter or digit")
    if not isinstance(entry, Mapping):
        raise ScheduleError(name, "", f"a schedule is a dict, not {type(entry).__name__}")
    unknown = sorted(set(entry) - KEYS, key=str)
    if unknown:
        raise ScheduleError(name, str(unknown[0]), f"unknown key (the keys are: {', '.join(sorted(KEYS))})")
    values: dict[str, Any] = {"name": name}
    task, queue = entry.get("task"), entry.get("queue")
    if (task is None) == (queue is None):
        raise ScheduleError(name, "task", "give either 'task' (a Django task's dotted path) or 'queue' "
                            "(a handler worker's queue), not both or neither")
    if task is not None:
        if not isinstance(task, str) or not task or "." not in task:
            raise ScheduleError(name, "task", f"must be the dotted path of a @task(), not {task!r}")
        if "payload" in entry:
            raise ScheduleError(name, "payload", "is for a handler worker's work ('queue'): a Django task "
                                "gets 'args' and 'kwargs'")
        values["task"] = task
        args, kwargs = entry.get("args", []), entry.get("kwargs", {})
        if not isinstance(args, list | tuple):
            raise ScheduleError(name, "args", f"must be a list, not {type(args).__name__}")
        if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            raise ScheduleError(name, "kwargs", "must be a dict with string keys")
        values["args"], values["kwargs"] = tuple(args), dict(kwargs)
    else:
        from ..values import queue_name

        for key in ("args", "kwargs"):
            if key in entry:
                raise ScheduleError(name, key, "is for a Django task ('task'): a handler gets 'payload'")
        try:
            values["queue"] = queue_name(queue)
        except (TypeError, ValueError) as exc:
            raise ScheduleError(name, "queue", str(exc)) from None
        values["payload"] = entry.get("payload")
    cron, every = entry.get("cron"), entry.get("every")
    if (cron is None) == (every is None):
        raise ScheduleError(name, "cron", "give either 'cron' (an expression) or 'every' (seconds), not both "
                            "or neither")
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, int) or not 1 <= every <= 366 * 86400:
            raise ScheduleError(name, "every", f"must be a whole number of seconds from 1 to 31622400, not {every!r}")
        values["every"] = every
    zone = entry.get("timezone", "UTC")
    if not isinstance(zone, str) or not zone:
        raise ScheduleError(name, "timezone", f"must be the name of an IANA timezone, not {zone!r}")
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(name, "timezone", f"unknown timezone {zone!r} (an IANA name, e.g. 'Europe/Paris')",
                            kind="timezone") from None
    values["timezone"] = zone
    if cron is not None:
        values["cron"] = cron_expression(name, cron)
    catch_up = entry.get("catch_up", LATEST)
    if catch_up not in CATCH_UP:
        raise ScheduleError(name, "catch_up", f"must be one of {', '.join(CATCH_UP)}, not {catch_up!r}")
    values["catch_up"] = catch_up
    limit = entry.get("catch_up_limit", CATCH_UP_LIMIT)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise ScheduleError(name, "catch_up_limit", f"must be a whole number from 1 to 10000, not {limit!r}")
    values["catch_up_limit"] = limit
    return Schedule(**values)


class CronsimMissing(ScheduleError):
    """A cron schedule without the ``schedules`` extra installed."""


def cron_expression(name: str, cron: object) -> str:
    """``cron`` if cronsim can read it; ``ScheduleError`` (``CronsimMissing`` without cronsim) else."""
    if not isinstance(cron, str) or not cron.strip():
        raise ScheduleError(name, "cron", f"must be a cron expression such as '*/5 * * * *', not {cron!r}")
    try:
        from cronsim import CronSim, CronSimError
    except ImportError:
        raise CronsimMissing(name, "cron", "cron schedules need cronsim: pip install 'django-taskclaim[schedules]'") \
            from None
    try:
        CronSim(cron, datetime.now(UTC))
    except CronSimError as exc:
        raise ScheduleError(name, "cron", f"{cron!r} is not a cron expression: {exc}", kind="cron") from None
    return cron


def task_problem(schedule: Schedule) -> str | None:
    """Why the schedule's ``task`` cannot be enqueued (it does not import, is not a ``@task()``, or
    its backend is not a ``ClaimBackend``); ``None`` for a usable one or a handler's schedule."""
    if not schedule.task:
        return None
    from django.utils.module_loading import import_string

    try:
        task = import_string(schedule.task)
    except ImportError as exc:
        return f"{schedule.task!r} does not import: {exc}"
    if not hasattr(task, "enqueue") or not hasattr(task, "get_backend"):
        return f"{schedule.task!r} is not a task (declare it with @task())"
    from ..tasks.backend import ClaimBackend

    try:
        backend = task.get_backend()
    except Exception as exc:  # noqa: BLE001 - the framework's own error for an unknown backend alias
        return f"{schedule.task!r} runs on a backend that cannot be loaded: {exc}"
    if not isinstance(backend, ClaimBackend):
        return f"{schedule.task!r} runs on backend {task.backend!r} ({type(backend).__name__}), not a ClaimBackend"
    return None


def schedules(raw: object) -> list[Schedule]:
    """Every schedule of ``raw`` (``TASKCLAIM_SCHEDULES``); ``ScheduleError`` at the first problem."""
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        raise ScheduleError("", "", f"TASKCLAIM_SCHEDULES must be a dict of schedules, not {type(raw).__name__}")
    found = [parse(name, entry) for name, entry in raw.items()]
    folded: dict[str, str] = {}
    for each in found:  # the keys' suffix is matched without case on SQLite and MySQL
        other = folded.setdefault(each.name.lower(), each.name)
        if other != each.name:
            raise ScheduleError(each.name, "", f"differs from the schedule {other!r} only in case")
    return found
