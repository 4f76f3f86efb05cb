"""Firing ticks: each tick is a task identity, so any number of schedulers may enqueue it and it
runs once, with no leader.

A tick costs each scheduler one statement: an INSERT of the tick's task that does nothing when
the identity exists (``claims.insert_new``). What a scheduler has missed (after downtime, a pause,
a slow round) is judged from the database, not from its memory: the newest tick of the schedule
that has a task.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import DatabaseError, close_old_connections, connections

from ..conf import settings
from ..store import store_now
from .spec import ALL, LATEST, Schedule, schedules, task_problem

logger = logging.getLogger("django_taskclaim")

#: The most ticks still to come by the database clock that one round fires (a scheduler ahead).
MAX_AHEAD = 10_000
#: The longest a scheduler sleeps between two looks at the clock: a changed wall clock (or a
#: SIGSTOP) is noticed within this, and SIGTERM too.
MAX_SLEEP = 1.0


def configured() -> list[Schedule]:
    """Every schedule of ``TASKCLAIM_SCHEDULES``; ``ScheduleError`` names the first problem."""
    return schedules(settings.SCHEDULES)


def fire(schedule: Schedule, tick: datetime) -> bool:
    """Enqueue ``tick`` of ``schedule`` unless some scheduler did: whether this call did.

    A Django task goes through its ``ClaimBackend`` (its queue, priority, lease and attempts hold);
    a handler's work is a queued task of ``schedule.queue`` with ``schedule.payload``. Either is
    "not before" the tick (``run_after``), by the database clock: a scheduler whose clock runs
    ahead enqueues early, and the tick still starts no earlier than its time.
    """
    key = schedule.key(tick)
    if schedule.task:
        from django.utils.module_loading import import_string

        task = import_string(schedule.task)
        return bool(task.get_backend().enqueue_tick(task, key, schedule.args, dict(schedule.kwargs), tick))
    from ..claims import insert_new

    return insert_new(key, "", schedule.payload, queue=schedule.queue, run_after=tick,
                      dispatch={"schedule": schedule.name}) is not None


def newest_fired(schedule: Schedule, now: datetime) -> datetime | None:
    """The newest tick of ``schedule`` that has a task (in the default task database), or ``None``.

    First the last ``catch_up_limit`` ticks, by their keys (one indexed lookup); then, where none of
    them exists (a new schedule, or one stopped for longer), every key of the schedule.
    """
    from ..models import Task

    using = _database()
    recent = schedule.latest(now, schedule.catch_up_limit)
    keys = [schedule.key(tick) for tick in recent]
    found = set(Task.objects.using(using).filter(tenant="", key__in=keys).values_list("key", flat=True))
    for tick in reversed(recent):
        if schedule.key(tick) in found:
            return tick
    # The keys end with the schedule's name and begin with the tick (fixed width, so they sort in
    # time order); the suffix match is without case on some databases: each is checked again.
    for key in (Task.objects.using(using).filter(tenant="", key__endswith=schedule.suffix)
                .order_by("-key").values_list("key", flat=True)[:20]):
        named = schedule.tick_of(key)
        if named is not None:
            return named
    return None


def _database() -> str:
    from .. import routing

    return routing.route("")


@dataclass
class Due:
    """What one round of a schedule decided: the ticks to fire and the newest one considered."""

    ticks: list[datetime]
    last: datetime


def plan(schedule: Schedule, last: datetime | None, now: datetime, database_now: datetime | None = None, *,
         first: bool = False) -> Due:
    """The ticks of ``schedule`` to fire at ``now`` after ``last`` (the newest tick known fired),
    by its catch-up policy.

    Missed is judged by the database clock (``database_now``, where the scheduler read it; else
    ``now``): a tick still in the database's future was missed by nobody, whatever this
    scheduler's clock says. Such a tick fires, every one of them (it waits for its time as
    ``run_after``), so a scheduler whose clock runs ahead loses none of the ticks an on-time one
    would have fired. Of the ticks in the database's past, one is on time (or late by less than a
    period): it fires. More than one means ticks were missed: ``latest`` fires the newest, ``all``
    the newest ``catch_up_limit``, ``skip`` none (the next tick fires). ``last=None`` (a schedule
    never fired) fires nothing in the database's past, unless ``first`` (``--once``, which keeps no
    memory between runs): then its newest tick there, once.
    """
    cut = now if database_now is None else min(now, database_now)
    ticks: list[datetime] = []
    if last is None:
        recent = schedule.latest(cut, 1)
        if not recent:  # a cron expression with no tick in the last 400 days
            return Due([], cut)
        last = recent[-1]
        if first:
            ticks.append(last)
    else:
        missed = schedule.due(last, cut, schedule.catch_up_limit)
        if len(missed) == 1 or schedule.catch_up == ALL:
            ticks += missed
        elif schedule.catch_up == LATEST:
            ticks += missed[-1:]
        if missed:  # SKIP fires none of them
            last = missed[-1]
    ahead = _between(schedule, last, now)
    return Due(ticks + ahead, ahead[-1] if ahead else last)


def _between(schedule: Schedule, since: datetime, until: datetime) -> list[datetime]:
    """The ticks of ``schedule`` after ``since`` up to ``until`` (included), the first
    :data:`MAX_AHEAD` of them: a round stays bounded however far a clock runs ahead, and the next
    round goes on from the last one fired."""
    found: list[datetime] = []
    for tick in schedule.after(since):
        if tick > until or len(found) >= MAX_AHEAD:
            break
        found.append(tick)
    return found


class Scheduler:
    """Fires the due ticks of every schedule, one round at a time (``run_pending``) or in a loop
    (``run``) until ``stop`` is set. Any number may run, on any host."""

    def __init__(self, found: list[Schedule] | None = None, *, clock: Callable[[], datetime] | None = None,
                 on_fire: Callable[[Schedule, datetime, bool], None] | None = None) -> None:
        self.schedules = configured() if found is None else found
        for schedule in self.schedules:
            problem = task_problem(schedule)
            if problem is not None:
                from .spec import ScheduleError

                raise ScheduleError(schedule.name, "task", problem)
        self.clock = clock or (lambda: datetime.now(UTC))
        self.on_fire = on_fire
        #: The newest tick of each schedule known to have a task (or skipped): what the next round
        #: starts after. ``None``: read from the database first.
        self.last: dict[str, datetime | None] = {}
        self.fired = 0

    def run_pending(self, *, first: bool = False) -> int:
        """Fire what is due now; how many ticks this scheduler created (others' count as done).
        ``first``: a schedule that never fired fires its newest tick (``--once``: see :func:`plan`)."""
        created = 0
        now = self.clock()
        for schedule in self.schedules:
            last = self.last.get(schedule.name)
            due = schedule.due(last, now, 2) if last is not None else []
            database_now = None
            if last is None or len(due) > 1:
                # A first round, or more than one tick due since this scheduler's last: ask the
                # database what was fired (by other schedulers meanwhile, or before a restart),
                # and its clock, which alone says which ticks were missed (plan()).
                last = newest_fired(schedule, now)
                database_now = store_now(_database())
                if (now - database_now).total_seconds() > MAX_SLEEP:
                    logger.warning("scheduler's clock is %.1f s ahead of the database's: ticks are enqueued early "
                                   "(each still starts at its time)", (now - database_now).total_seconds(),
                                   extra={"schedule": schedule.name})
            decided = plan(schedule, last, now, database_now, first=first)
            for tick in decided.ticks:
                made = fire(schedule, tick)
                created += made
                if self.on_fire is not None:
                    self.on_fire(schedule, tick, made)
                if made:
                    logger.info("schedule %s: fired tick %s", schedule.name, tick.isoformat(),
                                extra={"schedule": schedule.name, "key": schedule.key(tick)})
            self.last[schedule.name] = decided.last
        self.fired += created
        return created

    def next_wake(self) -> float:
        """Seconds until the next tick of any schedule (at most :data:`MAX_SLEEP`)."""
        now = self.clock()
        soonest = MAX_SLEEP
        for schedule in self.schedules:
            tick = schedule.next_after(now)
            if tick is not None:
                soonest = min(soonest, max(0.0, (tick - now).total_seconds()))
        return soonest

    def run(self, stop: threading.Event) -> None:
        """Fire due ticks until ``stop`` is set (SIGTERM, or the worker's end)."""
        try:
            self._loop(stop)
        finally:
            # In a worker's thread (--schedule) the connections are this thread's own: closed
            # with it, not left open until the process ends.
            connections.close_all()

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            close_old_connections()
            try:
                self.run_pending()
            except DatabaseError:
                # A database that is down now may answer at the next round: the loop goes on, and
                # says so each time (logged with its traceback); any other error ends the loop.
                logger.exception("scheduler round failed; trying again")
                stop.wait(MAX_SLEEP)
                continue
            stop.wait(self.next_wake())


def run_in_thread(stop: threading.Event, **options: Any) -> threading.Thread:
    """A scheduler loop in a daemon thread of the calling process (``taskclaim_worker --schedule``)."""
    scheduler = Scheduler(**options)
    thread = threading.Thread(target=scheduler.run, args=(stop,), name="taskclaim-scheduler", daemon=True)
    thread.start()
    return thread
