"""``--limits``: part of the harness's tasks under concurrency limits, and the checker's
**limit never exceeded** and **limit used**.

With ``--limits`` the harness gives every other task it enqueues one of ``--limit-keys`` keys
(``chaos-limit-0``, ``chaos-limit-1`` …) and a limit of ``--limit``
(``Task.objects.ensure(..., concurrency_key=, concurrency_limit=)``), and the workers write a
fenced ``start`` effect right after each claim, before any work (``worker.py --mark-start``).

What is counted. An *execution* is one claim of a limited task (the task and its token), from its
first fenced write to its last: the ``start`` effect to the final effect written with the
completion, or to its last step when it ended otherwise (killed, refused, failed, released). Each
write is stamped with the database clock inside its fenced transaction, after the row lock and the
token check, so it committed only while the claim held its task: RUNNING under that token. A
token holds its task over one unbroken stretch (a takeover or a reclaim moves the task off it for
good, and its later writes are refused), so at every instant of that interval the task was RUNNING
under the claim: one of the tasks the claim statement counts against the key's limit (every RUNNING
task of the key, whatever its lease: a paused owner past its lease keeps its place until its task
is taken over or reclaimed, docs/django-tasks.md "What counts"; once it is, its writes are refused
and its interval has ended). The property: at no instant do more than the key's limit of these
intervals overlap.

Not counted by the attempts' own ``started_at``/``ended_at``: those are the start times of the
statements that wrote them, and a claim that waited for its key's gate carries a start from before
the completion it waited for (a count by them sees the limit + 1 for the milliseconds of the wait).
The intervals counted lie inside the claims' real holding (a claim is held from its commit, before
the first write, to the commit of its end, after the last), so the count errs low, never high.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

KEY_PREFIX = "chaos-limit-"


def limit_of(n: int, keys: int, limit: int) -> dict[str, Any]:
    """The ``ensure()`` options of the harness's ``n``-th task: every other one is limited."""
    if n % 2:
        return {}
    return {"concurrency_key": f"{KEY_PREFIX}{n // 2 % keys}", "concurrency_limit": limit}


@dataclass(frozen=True)
class Execution:
    """One claim of a limited task, from its first fenced write to its last (database clock)."""

    task_key: str
    token: int
    start: dt.datetime
    end: dt.datetime


def executions(tasks: Iterable[dict[str, Any]], effects: Iterable[dict[str, Any]]) -> dict[str, list[Execution]]:
    """The executions of each concurrency key, from the final state's tasks and effects."""
    key_of = {t["key"]: t["concurrency_key"] for t in tasks if t.get("concurrency_key")}
    writes: dict[tuple[str, int], list[dt.datetime]] = defaultdict(list)
    for e in effects:
        if e["task_key"] in key_of:
            writes[(e["task_key"], e["token"])].append(e["created_at"])
    found: dict[str, list[Execution]] = defaultdict(list)
    for (task_key, token), times in writes.items():
        found[key_of[task_key]].append(Execution(task_key, token, min(times), max(times)))
    return found


def most_at_once(runs: list[Execution]) -> tuple[int, dt.datetime | None]:
    """The most executions overlapping at one instant, and the first instant it was reached. An
    execution that ends at the instant another starts does not overlap it (ends sort first)."""
    edges = sorted([(r.start, 1) for r in runs] + [(r.end, -1) for r in runs], key=lambda e: (e[0], e[1]))
    now = most = 0
    when = None
    for at, step in edges:
        now += step
        if now > most:
            most, when = now, at
    return most, when


def busy_share(runs: list[Execution], limit: int) -> float:
    """How much of the key's places its executions filled, from its first start to its last end."""
    if not runs:
        return 0.0
    window = (max(r.end for r in runs) - min(r.start for r in runs)).total_seconds()
    busy = sum((r.end - r.start).total_seconds() for r in runs)
    return busy / (limit * window) if window > 0 else 0.0


def check_limits(tasks: list[dict[str, Any]],
                 effects: list[dict[str, Any]]) -> tuple[dict[str, int], dict[str, list[str]]]:
    """**Limit never exceeded** (a violation per key over its limit) and **limit used** (figures
    only): per key, the most executions at once against the key's limit (the highest limit its
    tasks carry: a task is judged by its own, so the key never runs more than that)."""
    violations: dict[str, list[str]] = defaultdict(list)
    limits: dict[str, int] = {}
    limited = 0
    for t in tasks:
        if t.get("concurrency_key"):
            limited += 1
            limits[t["concurrency_key"]] = max(limits.get(t["concurrency_key"], 0), t["concurrency_limit"])
    found = executions(tasks, effects)
    most_seen = full = 0
    use: list[float] = []
    for key in sorted(limits):
        runs = found.get(key, [])
        most, when = most_at_once(runs)
        most_seen = max(most_seen, most)
        full += most >= limits[key]
        use.append(busy_share(runs, limits[key]))
        if most > limits[key]:
            at_once = [r for r in runs if when is not None and r.start <= when < r.end]
            violations["limit exceeded"].append(
                f"{key}: {most} executions at once at {when} (limit {limits[key]}): "
                + ", ".join(f"{r.task_key} token {r.token} [{r.start}, {r.end}]" for r in at_once[:6]))
    figures = {
        "limit_keys": len(limits),
        "limited_tasks": limited,
        "limited_executions": sum(len(found.get(key, [])) for key in limits),
        "limit_most_at_once": most_seen,
        "limit_keys_full": full,
        "limit_use_pct": round(100 * min(use)) if use else 0,
        "limit_over": len(violations["limit exceeded"]),
    }
    return figures, violations


LABELS = (
    ("limited_tasks", "limited tasks (every other task)"),
    ("limited_executions", "executions of limited tasks with a fenced write"),
    ("limit_most_at_once", "most executions of one key at once"),
    ("limit_keys_full", "keys that ran at their limit at some instant"),
    ("limit_use_pct", "least use of a key's places, first start to last end (%)"),
    ("limit_over", "KEYS OVER THEIR LIMIT"),
)


def limit_lines(figures: dict[str, int], keys: int, limit: int) -> str:
    """The limits' section of the table (its violations are in the table's own list)."""
    lines = ["", "", f"concurrency limits ({keys} keys, limit {limit}; each execution from its first "
             "fenced write to its last)"]
    lines += [f"  {label:<56} {figures.get(name, 0):>8}" for name, label in LABELS]
    return "\n".join(lines)
