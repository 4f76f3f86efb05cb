"""Schedules (``TASKCLAIM_SCHEDULES``) in one process: ticks as identities, catch-up judged from the
database, DST, Django tasks and handler work, the cost of a tick. Real scheduler processes racing
under SIGKILL, SIGSTOP and a skewed clock: tests/processes/test_schedules_processes.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from django_taskclaim.claims import claim_next
from django_taskclaim.conf import settings as conf
from django_taskclaim.identity import TaskKey
from django_taskclaim.management.base import database_now
from django_taskclaim.models import Attempt, Task
from django_taskclaim.schedules import Schedule, ScheduleError, Scheduler
from django_taskclaim.schedules.firing import fire, newest_fired
from django_taskclaim.schedules.spec import parse
from django_taskclaim.tasks.compat import task_backends
from django_taskclaim.tasks.runner import TaskRunner
from django_taskclaim.worker import work
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)


class Clock:
    """A scheduler's wall clock, moved by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def every(seconds: int = 10, **more: object) -> Schedule:
    return parse("beat", {"task": "tests.testapp.tasks.tick", "every": seconds, "kwargs": {"label": "x"}, **more})


def ticks_in_db() -> list[str]:
    return sorted(Task.objects.filter(key__endswith="schedule%3Abeat").values_list("key", flat=True))


def key(tick: datetime) -> str:
    return TaskKey("schedule:beat", run=tick.strftime("%Y-%m-%dT%H:%M:%SZ")).key


def drain() -> None:
    work(TaskRunner("default"), owner="tester", queue=["default", "emails"], until_drained=True, poll=0.02)


def test_a_tick_is_the_identity_the_design_names() -> None:
    schedule = every(10)
    assert schedule.key(T0) == TaskKey("schedule:beat", run="2026-12-06T12:00:00Z").key
    assert schedule.tick_of(schedule.key(T0)) == T0
    assert schedule.tick_of(TaskKey("schedule:other", run="2026-12-06T12:00:00Z").key) is None


def test_three_schedulers_enqueue_each_tick_once_and_it_runs_once_as_the_tick() -> None:
    clock = Clock(T0 + timedelta(seconds=1))
    schedulers = [Scheduler([every(10)], clock=clock) for _ in range(3)]
    for scheduler in schedulers:  # a schedule never fired: nothing before its first tick
        assert scheduler.run_pending() == 0
    for step in (10, 20, 30):
        clock.now = T0 + timedelta(seconds=step, milliseconds=5)
        assert sum(scheduler.run_pending() for scheduler in schedulers) == 1
    assert ticks_in_db() == sorted(key(T0 + timedelta(seconds=s)) for s in (10, 20, 30))
    drain()
    for row in Task.objects.filter(key__endswith="schedule%3Abeat"):
        # The task got the schedule's kwargs, and current_claim().key names the tick.
        assert row.status == Task.Status.SUCCEEDED and row.result == {"key": row.key, "label": "x"}
        assert row.run_after is not None and row.task_path == "tests.testapp.tasks.tick"
        assert Attempt.objects.filter(task=row).count() == 1


def test_the_tasks_queue_priority_and_options_hold_and_the_tick_key_wins_over_keyed() -> None:
    schedule = parse("mail", {"task": "tests.testapp.tasks.keyed_tick", "cron": "* * * * *", "args": ["a"]})
    assert fire(schedule, T0) is True
    assert fire(schedule, T0) is False
    row = Task.objects.get()
    assert (row.key, row.queue, row.priority) == (schedule.key(T0), "emails", 7)
    assert row.payload == {"args": ["a"], "kwargs": {}}
    assert row.max_attempts == task_backends["default"].max_attempts_for(tasks.keyed_tick.func)


def test_a_handler_schedule_is_plain_queued_work_with_its_payload() -> None:
    schedule = parse("sweep", {"queue": "sweeps", "payload": {"older_than": 30}, "every": 60})
    assert fire(schedule, T0) is True
    [claim] = claim_next(owner="w", queue="sweeps")
    assert claim.key == schedule.key(T0) and claim.payload == {"older_than": 30}
    row = Task.objects.get()
    assert row.task_path == "" and row.run_after == T0


def test_a_tick_fired_early_by_a_clock_ahead_does_not_start_before_its_time() -> None:
    # A scheduler whose clock runs ahead enqueues the tick early: "not before" the tick holds it
    # back, by the database clock.
    schedule = parse("later", {"queue": "sweeps", "every": 60})
    future = (datetime.now(UTC) + timedelta(minutes=5)).replace(second=0, microsecond=0)
    assert fire(schedule, future) is True
    assert claim_next(owner="w", queue="sweeps") == []


@pytest.mark.parametrize(("catch_up", "fired"), [("latest", [60]), ("all", [20, 30, 40, 50, 60]), ("skip", [])])
def test_catch_up_after_downtime_is_judged_from_the_database(catch_up: str, fired: list[int]) -> None:
    schedule = every(10, catch_up=catch_up)
    fire(schedule, T0 + timedelta(seconds=10))  # what a scheduler fired before everything stopped
    # A new scheduler process (no memory of it) starts 55 s later.
    scheduler = Scheduler([schedule], clock=Clock(T0 + timedelta(seconds=65)))
    scheduler.run_pending()
    assert ticks_in_db() == sorted(key(T0 + timedelta(seconds=s)) for s in [10, *fired])
    scheduler.clock = Clock(T0 + timedelta(seconds=70, milliseconds=1))  # and on time from then on
    assert scheduler.run_pending() == 1


def test_catch_up_all_is_bounded_by_catch_up_limit() -> None:
    schedule = every(1, catch_up="all", catch_up_limit=5)
    fire(schedule, T0)
    Scheduler([schedule], clock=Clock(T0 + timedelta(seconds=100))).run_pending()
    assert ticks_in_db() == sorted(key(T0 + timedelta(seconds=s)) for s in [0, 96, 97, 98, 99, 100])


def test_a_scheduler_that_was_paused_asks_the_database_and_fires_no_tick_twice() -> None:
    clock_a, clock_b = Clock(T0), Clock(T0)
    a, b = Scheduler([every(10)], clock=clock_a), Scheduler([every(10)], clock=clock_b)
    fire(every(10), T0)
    a.run_pending(), b.run_pending()  # b is then paused for 40 s; a goes on
    for step in (10, 20, 30, 40):
        clock_a.now = T0 + timedelta(seconds=step)
        assert a.run_pending() == 1
    clock_b.now = T0 + timedelta(seconds=40, milliseconds=2)
    assert b.run_pending() == 0
    assert newest_fired(every(10), clock_b.now) == T0 + timedelta(seconds=40)


@pytest.mark.parametrize("policy", ["latest", "skip", "all"])
def test_a_scheduler_whose_clock_runs_ahead_misses_no_tick_of_the_databases_future(policy: str) -> None:
    # Issue 40, item 6: an on-time scheduler fired the tick of now; one 30 s ahead starts and
    # asks the database. The 15 ticks between are in the database's future: nobody missed them,
    # and if the on-time one dies they are this one's to fire (each waits for its time).
    schedule = every(2, catch_up=policy)
    on_time = schedule.latest(database_now(), 1)[0]
    fire(schedule, on_time)
    ahead = Clock(on_time + timedelta(seconds=30, milliseconds=500))
    assert Scheduler([schedule], clock=ahead).run_pending() == 15
    assert ticks_in_db() == sorted(key(on_time + timedelta(seconds=s)) for s in range(0, 31, 2))


def test_a_tick_costs_a_scheduler_one_statement() -> None:
    """Item 5 of issue 33: a tick costs each scheduler at most one statement."""
    schedule = every(10)
    clock = Clock(T0 + timedelta(seconds=1))
    first, second = Scheduler([schedule], clock=clock), Scheduler([schedule], clock=clock)
    fire(schedule, T0)
    first.run_pending(), second.run_pending()  # each read the newest tick once, at its start
    clock.now = T0 + timedelta(seconds=10, milliseconds=3)
    connection = connections[conf.DATABASE]
    with CaptureQueriesContext(connection) as created:
        assert first.run_pending() == 1
    with CaptureQueriesContext(connection) as met:
        assert second.run_pending() == 0
    assert len(met.captured_queries) == 1, met.captured_queries  # one INSERT that did nothing
    # The one that created it: one INSERT … RETURNING; MySQL has no RETURNING and reads it back.
    assert len(created.captured_queries) == (2 if connection.vendor == "mysql" else 1), created.captured_queries
    with CaptureQueriesContext(connection) as idle:
        assert first.run_pending() == 0  # nothing due: nothing asked
    assert idle.captured_queries == []


# -- DST, on real dates of Europe/Paris ------------------------------------------------------------
PARIS = ZoneInfo("Europe/Paris")


def day_ticks(schedule: Schedule, day: datetime) -> list[datetime]:
    start = day.replace(tzinfo=PARIS).astimezone(UTC)
    end = (day + timedelta(days=1)).replace(tzinfo=PARIS).astimezone(UTC)
    return schedule.due(start - timedelta(microseconds=1), end - timedelta(microseconds=1), 10_000)


def cron(expr: str) -> Schedule:
    return parse("dst", {"queue": "q", "cron": expr, "timezone": "Europe/Paris"})


def test_dst_repeated_hour_a_wall_clock_time_fires_once() -> None:
    # 2026-10-25: 03:00 CEST goes back to 02:00 CET; 02:30 happens twice on the wall clock.
    ticks = day_ticks(cron("30 2 * * *"), datetime(2026, 10, 25))
    assert ticks == [datetime(2026, 10, 25, 0, 30, tzinfo=UTC)]  # 02:30 CEST, its first pass only
    # Looking back from 02:00:01 CET (what catch-up and the admin do): that 02:30 CEST is the newest.
    assert cron("30 2 * * *").latest(datetime(2026, 10, 25, 1, 0, 1, tzinfo=UTC), 2) == [
        datetime(2026, 10, 24, 0, 30, tzinfo=UTC), datetime(2026, 10, 25, 0, 30, tzinfo=UTC)]


def test_dst_every_hour_fires_by_elapsed_time_25_ticks_on_the_long_day() -> None:
    ticks = day_ticks(cron("0 * * * *"), datetime(2026, 10, 25))
    assert len(ticks) == 25 and len(set(ticks)) == 25  # 02:00 CEST and 02:00 CET: two instants, two ticks
    assert datetime(2026, 10, 25, 0, 0, tzinfo=UTC) in ticks and datetime(2026, 10, 25, 1, 0, tzinfo=UTC) in ticks


def test_dst_gap_a_time_that_does_not_exist_fires_once_at_the_end_of_the_gap() -> None:
    # 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist.
    assert day_ticks(cron("30 2 * * *"), datetime(2026, 3, 29)) == [datetime(2026, 3, 29, 1, 0, tzinfo=UTC)]
    # An expression of every hour fires by elapsed time: no tick for the hour that did not happen.
    ticks = day_ticks(cron("*/30 * * * *"), datetime(2026, 3, 29))
    assert len(ticks) == 46 and len(set(ticks)) == 46


def test_every_is_aligned_to_the_epoch_whatever_the_timezone() -> None:
    schedule = parse("e", {"queue": "q", "every": 3600, "timezone": "Europe/Paris"})
    assert schedule.next_after(T0 + timedelta(minutes=5)) == T0 + timedelta(hours=1)


def test_a_scheduler_refuses_a_task_that_is_not_a_task() -> None:
    with pytest.raises(ScheduleError, match=r"'task'.*is not a task"):
        Scheduler([parse("bad", {"task": "tests.testapp.tasks.Path", "every": 1})])


def test_a_cron_schedule_catches_up_from_the_database_in_its_timezone() -> None:
    schedule = parse("beat", {"task": "tests.testapp.tasks.tick", "cron": "*/5 * * * *", "catch_up": "all"})
    fire(schedule, T0)
    Scheduler([schedule], clock=Clock(T0 + timedelta(minutes=17, seconds=30))).run_pending()
    assert ticks_in_db() == sorted(key(T0 + timedelta(minutes=m)) for m in (0, 5, 10, 15))
    # Europe/Paris, the night of 2026-10-25: 02:00 CEST fired; an hour later the wall clock says
    # 02:00 again (CET), another instant: a tick of its own, fired once by however many schedulers.
    paris = parse("beat", {"task": "tests.testapp.tasks.tick", "cron": "0 * * * *", "timezone": "Europe/Paris"})
    first = datetime(2026, 10, 25, 0, 0, tzinfo=UTC)
    fire(paris, first)
    clock = Clock(first + timedelta(hours=1, seconds=1))
    assert sum(Scheduler([paris], clock=clock).run_pending() for _ in range(3)) == 1
    assert newest_fired(paris, clock.now) == first + timedelta(hours=1)
