"""The figures of the admin's dashboard (``admin:django_taskclaim_dashboard``), which the Prometheus
metrics report under the same names (``metrics.DashboardCollector``).

Everything is aggregated by the database, from what the app keeps anyway: the attempt rows (the audit
trail, ``TASKCLAIM_AUDIT``: one per claim, with its start, end, outcome and fenced-off writes), read
through their ``started_at`` index over the window, joined to their task for its queue and path.
Per window, one GROUP BY query gives every figure per queue and task path, the time quantiles
included (from counts under fixed bounds: :data:`BOUNDS`); one more gives the chart over time.

A window counts the attempts *started* in it, by the database clock: ``started`` all of them (not
the duplicate deliveries, which never ran), ``succeeded`` and ``failed`` (failed for good or to be
retried) those that have ended so, ``takeovers`` those whose lease expired and another claim took
the task, ``fenced_writes`` the writes refused to them once fenced off.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import accumulate
from typing import Any, cast

from django.db import connections, transaction
from django.db.models import (
    Case,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    IntegerField,
    Max,
    Min,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, TruncHour, TruncMinute

from . import routing
from .models import Attempt, Task
from .status import Outcome, Status
from .store import DbNow, DbNowPlus, get_store

#: The windows, by name: their length in seconds, and the width of a bar of the chart over time.
WINDOWS: dict[str, tuple[int, int]] = {"1h": (3600, 300), "1d": (86400, 3600)}
#: The upper bounds (seconds) of the time counts the quantiles are read from: a quantile is exact at
#: a bound and interpolated linearly between two (the error is at most the gap between them).
BOUNDS: tuple[float, ...] = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 21600, 86400)
QUANTILES = (0.5, 0.95)
#: The running tasks the dashboard lists (the newest first).
RUNNING_SHOWN = 50
#: The names shared with the metrics (``taskclaim_window_<name>``).
COUNTS = ("started", "succeeded", "failed", "takeovers", "fenced_writes")
FAILED = (Outcome.FAILED.value, Outcome.RETRY.value)


@dataclass
class Group:
    """The figures of one queue and task path (``queue`` ``None``: tasks claimed by key) in a window."""

    database: str
    queue: str | None
    task_path: str
    started: int = 0
    succeeded: int = 0
    failed: int = 0
    takeovers: int = 0
    fenced_writes: int = 0
    #: ``{0.5: seconds, 0.95: seconds}``; empty when nothing was measured.
    wait: dict[float, float] = field(default_factory=dict)
    run: dict[float, float] = field(default_factory=dict)

    @property
    def wait_p50(self) -> float | None:
        return self.wait.get(0.5)

    @property
    def wait_p95(self) -> float | None:
        return self.wait.get(0.95)

    @property
    def run_p50(self) -> float | None:
        return self.run.get(0.5)

    @property
    def run_p95(self) -> float | None:
        return self.run.get(0.95)

    @property
    def label(self) -> str:
        queue = "(by key)" if self.queue is None else self.queue
        return f"{queue} · {self.task_path}" if self.task_path else queue


@dataclass
class Window:
    """One window's figures, per queue and task path, and over time (bars of ``step`` seconds)."""

    name: str
    seconds: int
    step: int
    groups: list[Group]
    #: Per bar, oldest first: ``(start, {"started": n, "succeeded": n, "failed": n})``.
    series: list[tuple[datetime, dict[str, int]]]
    unreachable: dict[str, str]

    def total(self, name: str) -> int:
        return sum(getattr(g, name) for g in self.groups)


def quantile(cumulative: list[int], total: int, q: float) -> float | None:
    """The ``q`` quantile of ``total`` values of which ``cumulative[i]`` are under ``BOUNDS[i]``:
    interpolated between the bounds around it; ``BOUNDS[-1]`` at most (``None`` with no value)."""
    if total <= 0:
        return None
    wanted = q * total
    below, lower = 0, 0.0
    for bound, count in zip(BOUNDS, cumulative, strict=True):
        if count >= wanted:
            inside = count - below
            share = 1.0 if inside <= 0 else (wanted - below) / inside
            return lower + (bound - lower) * share
        below, lower = count, bound
    return BOUNDS[-1]


def _seconds(td: float) -> timedelta:
    return timedelta(seconds=td)


#: The outcomes of attempts that ran: every one but a duplicate delivery's.
RAN = tuple(o for o in Outcome.values if o != Outcome.DUPLICATE)


def first_task(alias: str, seconds: int) -> int | None:
    """The lowest task id among the attempts started in the last ``seconds`` (``None``: none)."""
    # min(task_id + 0), not min(task_id): with the bare column PostgreSQL walks the attempts' (task,
    # token) index from the lowest id for the first recent one, the whole table when the recent
    # attempts are of the newest tasks (1.3 s at 10 million); the sum reads the window by started_at.
    found = (Attempt.objects.using(alias).filter(started_at__gte=DbNowPlus(-seconds))
             .aggregate(first=Min(F("task_id") + 0)))["first"]
    return None if found is None else int(found)


def _bucket(name: str, unmeasured: Q) -> Case:
    """The index of the first of :data:`BOUNDS` that the duration ``name`` is under (``len(BOUNDS)``
    past the last one; -1 where ``unmeasured``): one CASE a row, so that the query counts rows per
    bucket instead of evaluating a filtered count per bound."""
    whens = [When(unmeasured, then=Value(-1))]
    whens += [When(**{f"{name}__lt": _seconds(bound)}, then=Value(i)) for i, bound in enumerate(BOUNDS)]
    return Case(*whens, default=Value(len(BOUNDS)), output_field=IntegerField())


def figures_query(alias: str, seconds: int, first: int) -> QuerySet[Any]:
    """The one query of :func:`group_figures`: the attempts started in the last ``seconds`` (the
    attempts' ``started_at`` index) joined to their tasks, counted per queue, task path, outcome and
    the buckets of their wait and run time (at most 9 × 17 × 17 rows a queue and path).

    ``first``, the lowest task id among those attempts (:func:`first_task`), bounds the tasks read
    to a range of the primary key: without it PostgreSQL hashes the attempts and scans the whole
    task table for them (363 ms at 1 million tasks, growing with the table, not the window). An
    attempt of an older task that starts between the two queries is counted by the next page."""
    a = "attempt_set__"
    wait = ExpressionWrapper(F(f"{a}started_at") - Coalesce("run_after", "created_at"), output_field=DurationField())
    run = ExpressionWrapper(F(f"{a}ended_at") - F(f"{a}started_at"), output_field=DurationField())
    # One filter() call: the counts below count the attempts it joined (the same join).
    return (Task.objects.db_manager(alias).get_queryset()
            .filter(**{"pk__gte": first, f"{a}started_at__gte": DbNowPlus(-seconds), f"{a}outcome__in": RAN})
            .alias(wait=wait, run=run)
            .annotate(outcome=F(f"{a}outcome"), wait_bucket=_bucket("wait", Q(wait__lt=timedelta(0))),
                      run_bucket=_bucket("run", Q(**{f"{a}ended_at__isnull": True})))
            .values("queue", "task_path", "outcome", "wait_bucket", "run_bucket")
            .annotate(n=Count(f"{a}id"), fenced=Sum(f"{a}stale_writes")).order_by())


@contextmanager
def reporting(alias: str) -> Iterator[None]:
    """A transaction with the store's settings for a report's queries (PostgreSQL: no JIT)."""
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        get_store(alias).report_settings(cursor)
        yield


def group_figures(alias: str, seconds: int) -> list[Group]:
    """Two queries: every figure of each queue and task path over the last ``seconds``."""
    with reporting(alias):
        first = first_task(alias, seconds)
        rows = [] if first is None else list(figures_query(alias, seconds, first))
    groups: dict[tuple[str | None, str], Group] = {}
    waits: dict[tuple[str | None, str], list[int]] = {}
    runs: dict[tuple[str | None, str], list[int]] = {}
    for row in cast("list[dict[str, Any]]", rows):
        key = (row["queue"], row["task_path"])
        group = groups.setdefault(key, Group(alias, *key))
        n, outcome = int(row["n"]), row["outcome"]
        group.started += n
        group.succeeded += n if outcome == Outcome.SUCCEEDED else 0
        group.failed += n if outcome in FAILED else 0
        group.takeovers += n if outcome == Outcome.TAKEN_OVER else 0
        group.fenced_writes += int(row["fenced"] or 0)
        for buckets, index in ((waits, row["wait_bucket"]), (runs, row["run_bucket"])):
            if index >= 0:
                buckets.setdefault(key, [0] * (len(BOUNDS) + 1))[index] += n
    for key, group in groups.items():
        for q in QUANTILES:
            for buckets, into in ((waits, group.wait), (runs, group.run)):
                if key in buckets:
                    counts = buckets[key]
                    found = quantile(list(accumulate(counts[:len(BOUNDS)])), sum(counts), q)
                    if found is not None:
                        into[q] = found
    return [groups[key] for key in sorted(groups, key=lambda k: (k[0] is not None, k[0] or "", k[1]))]


def series(alias: str, seconds: int, step: int) -> tuple[datetime | None, dict[int, dict[str, int]]]:
    """One query: the attempts started in the window by minute (hour, for bars of an hour) and
    outcome, added up into bars of ``step`` seconds, numbered back from the database's now (0: the
    newest); and that now."""
    trunc = TruncHour("started_at") if step >= 3600 else TruncMinute("started_at")
    query = (Attempt.objects.using(alias).filter(started_at__gte=DbNowPlus(-seconds))
             .exclude(outcome=Outcome.DUPLICATE).annotate(at=trunc).values("at", "outcome")
             .annotate(n=Count("pk"), now=Max(DbNow())).order_by())
    bars: dict[int, dict[str, int]] = {}
    now = None
    with reporting(alias):
        rows = list(query)
    for row in rows:
        now = row["now"]
        back = max(0, int((now - row["at"]).total_seconds() // step))
        bar = bars.setdefault(min(back, seconds // step - 1), {"started": 0, "succeeded": 0, "failed": 0})
        bar["started"] += row["n"]
        if row["outcome"] == Outcome.SUCCEEDED:
            bar["succeeded"] += row["n"]
        elif row["outcome"] in FAILED:
            bar["failed"] += row["n"]
    return now, bars


def window(name: str, aliases: tuple[str, ...] | None = None) -> Window:
    """The figures of window ``name`` (``"1h"``, ``"1d"``) of every task database (``aliases``);
    a database out of reach is named in ``unreachable``, the others still counted."""
    seconds, step = WINDOWS[name]
    groups: list[Group] = []
    bars: dict[int, dict[str, int]] = {}
    unreachable: dict[str, str] = {}
    now: datetime | None = None
    for alias in routing.databases() if aliases is None else aliases:
        try:
            groups += group_figures(alias, seconds)
            db_now, found = series(alias, seconds, step)
        except routing.UNREACHABLE as exc:
            unreachable[alias] = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            continue
        now = now or db_now
        for back, bar in found.items():
            mine = bars.setdefault(back, {"started": 0, "succeeded": 0, "failed": 0})
            for key, value in bar.items():
                mine[key] += value
    end = now or datetime.now().astimezone()
    count = seconds // step
    ordered = [(end - timedelta(seconds=step * (back + 1)), bars.get(back, {"started": 0, "succeeded": 0, "failed": 0}))
               for back in reversed(range(count))]
    return Window(name, seconds, step, groups, ordered, unreachable)


def running(alias: str, limit: int = RUNNING_SHOWN) -> list[Task]:
    """The running tasks of ``alias``, the newest first (the running index), with the database's now."""
    return list(Task.objects.db_manager(alias).running().annotate(db_now=DbNow()).order_by("-id")[:limit])


def limits_waiting(alias: str) -> list[dict[str, Any]]:
    """Each concurrency key with tasks pending or running: ``waiting`` (pending), ``running``, and
    its ``limit`` (the largest of its tasks'). One query, on the concurrency key's index."""
    rows = (Task.objects.db_manager(alias).get_queryset()
            .filter(status__in=(Status.PENDING, Status.RUNNING)).exclude(concurrency_key="")
            .values("concurrency_key").annotate(
                waiting=Count("pk", filter=Q(status=Status.PENDING)),
                running=Count("pk", filter=Q(status=Status.RUNNING)),
                limit=Max("concurrency_limit"))
            .order_by("concurrency_key"))
    return [{"database": alias, "key": r["concurrency_key"], "waiting": r["waiting"], "running": r["running"],
             "limit": r["limit"]} for r in rows]


def progress_text(task: Task) -> str:
    """A task's progress as the admin and ``taskclaim_inspect`` show it: ``"40% copying (token 3)"``,
    marked as an earlier attempt's when a later claim has not written any; ``"-"`` with none."""
    if task.progress is None:
        return "-"
    text = f"{task.progress * 100:.0f}%"
    if task.progress_note:
        text += f" {task.progress_note}"
    text += f" (token {task.progress_token})"
    if task.progress_token is not None and task.progress_token != task.fencing_token:
        text += " earlier attempt"
    return text


__all__ = ["BOUNDS", "COUNTS", "QUANTILES", "WINDOWS", "Group", "Window", "figures_query", "first_task",
           "group_figures",
           "limits_waiting", "progress_text", "quantile", "running", "series", "window"]
