"""``--schedules``: a 1-second schedule fired by scheduler processes under the nemesis, and the
checker's **every tick exactly once**.

The harness starts ``--schedulers`` (3) ``manage.py taskclaim_scheduler`` processes with
:data:`SCHEDULE` in ``TASKCLAIM_SCHEDULES`` (tests/chaos/settings.py reads it from
``CHAOS_SCHEDULES``): work for the harness's own workers (queue ``default``), so each tick is a
task the workers claim and execute like the others, in fenced steps. Its catch-up policy is
``all``: after every scheduler was down (killed, paused), the first one back fires each missed
tick (up to ``catch_up_limit``, 100), so no tick may be missing. (With ``latest`` or ``skip`` a
gap after such a downtime is the documented behaviour; the harness does not run them.)

The nemesis pauses and kills schedulers like workers, and once, from half-way, pauses every one of
them at once (a scheduler outage: the first one back must fire the ticks missed meanwhile). On
PostgreSQL and MariaDB the first scheduler's clock runs :data:`SKEW` ahead.

The harness waits for the first tick to have a task before the faults begin (:func:`ticks_fired`)
and, at the end of the faults, for the tick of that moment (:func:`newest_due`) before it stops
the schedulers; those two bound the ticks that must be there. The checker (:func:`check_ticks`):

- **tick missing**: every tick from the oldest fired to the last expected (and on to the newest
  fired) has a task;
- **tick twice**: no tick has more than one task, and the schedulers that reported on exit
  (``--json``) did not say they created more ticks than there are;
- **tick not run / tick ran twice**: each tick's task ended SUCCEEDED with exactly one final
  effect (it may have been claimed more than once under the faults: taken over, reclaimed);
- **tick early**: no claim of a tick started before the tick, by the database clock (a scheduler
  runs with its clock 2 s ahead on PostgreSQL and MariaDB).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any

NAME = "chaos-tick"
SCHEDULE: dict[str, Any] = {"queue": "default", "payload": {"tick": True}, "every": 1, "catch_up": "all"}
#: The skewed scheduler's clock (libfaketime), on the databases whose clock the claims use.
SKEW = "+2s"
#: A claim may start this much before its tick by the clocks' rounding (as the process test allows).
EARLY_SLACK = dt.timedelta(milliseconds=1)
#: A tick whose task was created this long after the tick was caught up (figure only): a scheduler
#: on time fires it within a few milliseconds of its time (within a second on a loaded machine).
LATE = dt.timedelta(seconds=1.5)
#: A tick whose task was created this long before the tick was fired by the skewed scheduler (figure only).
AHEAD = dt.timedelta(seconds=0.5)


def schedule() -> Any:
    """The harness's schedule, as ``django_taskclaim.schedules`` reads it."""
    from django_taskclaim.schedules.spec import parse

    return parse(NAME, SCHEDULE)


def ticks_fired() -> list[dt.datetime]:
    """The ticks of the schedule that have a task, in order."""
    from django_taskclaim.models import Task

    found = schedule()
    keys = Task.objects.filter(key__endswith=found.suffix).values_list("key", flat=True)
    return sorted(t for t in (found.tick_of(k) for k in keys) if t is not None)


def newest_due() -> dt.datetime:
    """The newest tick at or before the database's clock now."""
    from django_taskclaim.management.base import database_now

    return schedule().latest(database_now(), 1)[-1]


def check_ticks(tasks: list[dict[str, Any]], attempts: list[dict[str, Any]], effects: list[dict[str, Any]],
                first: dt.datetime | None, until: dt.datetime | None,
                reported: int) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Every tick from ``first`` to ``until`` (and on to the newest fired) exactly once, run once,
    never before its time; ``reported``: the ticks the schedulers that exited cleanly said they created."""
    violations: dict[str, list[str]] = defaultdict(list)
    spec = schedule()
    by_tick: dict[dt.datetime, list[dict[str, Any]]] = defaultdict(list)
    for t in tasks:
        tick = spec.tick_of(t["key"])
        if tick is not None:
            by_tick[tick].append(t)
    finals: dict[str, int] = defaultdict(int)
    for e in effects:
        if e["worker"].endswith("#final"):
            finals[e["task_key"]] += 1
    starts: dict[int, list[dt.datetime]] = defaultdict(list)
    for a in attempts:
        if a["token"] is not None:
            starts[a["task_id"]].append(a["started_at"])

    expected: list[dt.datetime] = []
    if first is None or until is None:
        violations["tick missing"].append("the harness saw no tick fired (it cannot say which were due)")
    else:
        # From the oldest tick fired (a scheduler that started before the skewed one fired its
        # first may fire an older tick after the harness saw a newer one) to the newest.
        tick: dt.datetime | None = min([first, *by_tick])
        last = max([until, *by_tick])
        while tick is not None and tick <= last:
            expected.append(tick)
            tick = spec.next_after(tick)
        for tick in expected:
            if tick not in by_tick:
                violations["tick missing"].append(f"{spec.key(tick)}: no task")
    for tick, rows in sorted(by_tick.items()):
        if len(rows) > 1:
            violations["tick twice"].append(f"{spec.key(tick)}: {len(rows)} tasks")
        for row in rows:
            n = finals.get(row["key"], 0)
            if row["status"] != "succeeded" or n == 0:
                violations["tick not run"].append(f"{row['key']}: ended {row['status']} with {n} final effect(s)")
            elif n > 1:
                violations["tick ran twice"].append(f"{row['key']}: {n} final effects")
            early = [s for s in starts.get(row["id"], []) if s < tick - EARLY_SLACK]
            if early:
                violations["tick early"].append(f"{row['key']}: claimed at {min(early)}, before its tick")
    fired = sum(len(rows) for rows in by_tick.values())
    if reported > fired:
        violations["tick twice"].append(f"the schedulers that reported created {reported} ticks; "
                                        f"{fired} have a task")
    figures = {
        "ticks_expected": len(expected),
        "ticks_fired": fired,
        "ticks_reported": reported,
        "tick_claims": sum(len(starts.get(r["id"], [])) for rows in by_tick.values() for r in rows),
        "ticks_late": sum(1 for tick, rows in by_tick.items()
                          if any(r.get("created_at") and r["created_at"] - tick > LATE for r in rows)),
        "ticks_ahead": sum(1 for tick, rows in by_tick.items()
                           if any(r.get("created_at") and tick - r["created_at"] > AHEAD for r in rows)),
        "ticks_missing": len(violations["tick missing"]),
        "ticks_twice": len(violations["tick twice"]),
        "ticks_not_run": len(violations["tick not run"]),
        "ticks_run_twice": len(violations["tick ran twice"]),
        "ticks_early": len(violations["tick early"]),
    }
    return figures, violations


LABELS = (
    ("ticks_expected", "ticks from the first fired to the last due (and fired)"),
    ("ticks_fired", "ticks with a task"),
    ("ticks_reported", "  created, as told by the schedulers that exited cleanly"),
    ("ticks_late", "  created over 1.5 s after their time (caught up)"),
    ("ticks_ahead", "  created over 0.5 s before their time (the skewed scheduler)"),
    ("tick_claims", "claims of tick tasks"),
    ("scheduler_kills", "schedulers SIGKILLed"),
    ("scheduler_pauses", "schedulers SIGSTOPped for 2-3x the lease"),
    ("scheduler_outages", "every scheduler SIGSTOPped at once, half-way"),
    ("skewed_schedulers", f"schedulers with their clock {SKEW} (libfaketime)"),
    ("ticks_missing", "TICKS MISSING"),
    ("ticks_twice", "TICKS WITH MORE THAN ONE TASK"),
    ("ticks_not_run", "TICKS NOT RUN"),
    ("ticks_run_twice", "TICKS RUN TWICE"),
    ("ticks_early", "TICKS STARTED BEFORE THEIR TIME"),
)


def tick_lines(figures: dict[str, int], schedulers: int, first: dt.datetime | None,
               until: dt.datetime | None) -> str:
    """The schedule's section of the table (its violations are in the table's own list)."""
    span = f"{first:%H:%M:%S} to {until:%H:%M:%S} UTC" if first and until else "no tick seen"
    lines = ["", "", f"schedule {NAME!r} (every 1 s, catch_up all; {schedulers} schedulers; {span})"]
    lines += [f"  {label:<56} {figures.get(name, 0):>8}" for name, label in LABELS]
    return "\n".join(lines)
