"""The Django Tasks phase in the Markdown report: its targets and its section."""

from __future__ import annotations

from .results import TasksResults
from .tasks_systems import OURS, OX_CONCURRENCY, PEERS, SYSTEMS

Row = tuple[str, str, str, bool | None]
TARGET = 2.0


def _best_per_round(runs: dict[str, list[float]], labels: list[str]) -> list[float]:
    """Per round, the best of ``labels`` (one system's configurations)."""
    columns = [runs[label] for label in labels if label in runs]
    return [max(column) for column in zip(*columns, strict=False)] if columns else []


def _labels(t: TasksResults, key: str) -> list[str]:
    return [label for label, system in t.system_of.items() if system == key]


def drain_best(t: TasksResults, key: str) -> list[float]:
    """Per round, a system's best drain rate (tasks/s) over its configurations."""
    return _best_per_round(t.drain_runs, _labels(t, key))


def bulk_best(t: TasksResults, key: str) -> list[float]:
    """Per round, a system's best bulk-enqueue rate (tasks/s) over its ways to enqueue."""
    rates = {label: [t.bulk_tasks / s for s in runs] for label, runs in t.bulk_runs.items()}
    return _best_per_round(rates, _labels(t, key))


def _ratios(ours: list[float], peer: list[float]) -> list[float]:
    return [a / b for a, b in zip(ours, peer, strict=False) if b]


def _row(name: str, t: TasksResults, ours: list[float], peer_key: str, peer: list[float]) -> Row:
    """The lowest per-round ratio decides (the highest beside it), or why it could not be taken."""
    missing = [(SYSTEMS[k].name, t.skipped[k]) for k in (OURS, peer_key) if k in t.skipped]
    if missing or not ours or not peer:
        why = "; ".join(f"{who}: {reason}" for who, reason in missing) or "no rounds"
        return name, f"not measured ({why})", f"≥ {TARGET:.2f}", None
    ratios = _ratios(ours, peer)
    low, high = min(ratios), max(ratios)
    shown = f"{low:.2f}" if low == high else f"{low:.2f} (max {high:.2f})"
    return name, shown, f"≥ {TARGET:.2f}", low >= TARGET


def targets(t: TasksResults) -> list[Row]:
    if not t.system_of and not t.skipped:
        return []
    rows: list[Row] = []
    for peer in PEERS:
        name = SYSTEMS[peer].name
        rows.append(_row(f"Django Tasks API: drain at W={t.workers}, django-taskclaim (ClaimBackend) at its best vs "
                         f"{name} at its best", t, drain_best(t, OURS), peer, drain_best(t, peer)))
    for peer in PEERS:
        name = SYSTEMS[peer].name
        rows.append(_row(f"Django Tasks API: bulk enqueue of {t.bulk_tasks:,} tasks in one transaction, "
                         f"django-taskclaim vs {name} at its best", t, bulk_best(t, OURS), peer, bulk_best(t, peer)))
    if t.duplicates:
        dups = sum(t.duplicates.values())
        rows.append(("duplicate executions, Django Tasks drain, every system", str(dups), "= 0", dups == 0))
    return rows


def _versions(found: dict[str, str]) -> str:
    return ", ".join(f"{'Python' if k == 'python' else k} {v}" for k, v in found.items())


def section(t: TasksResults) -> list[str]:
    """The phase's Markdown lines (none when the phase did not run)."""
    if not t.system_of and not t.skipped:
        return []
    lines = [
        f"## Django Tasks API: drain of {t.drain_tasks:,} no-op tasks at W = {t.workers}, bulk enqueue of "
        f"{t.bulk_tasks:,}",
        "",
        f"Each system's no-op task is enqueued through `Task.enqueue()` ({t.drain_tasks:,} in one transaction, "
        f"untimed, then `VACUUM ANALYZE`) and drained by the system's own worker command in {t.workers} processes, "
        "started, set up and then released together; the rate is the task count over the span from the first "
        "worker's start to the last one's exit. Every execution is counted (*duplicates*: executions beyond one "
        "per task, must be 0), every task must have run, and every task must be SUCCESSFUL in the system's own "
        "table. Each system runs in its own processes under its own interpreter: the peers at pinned versions in "
        "virtualenvs of their own (`benchmarks/tasks_systems.py`), every one with persistent connections "
        "(`CONN_MAX_AGE=None`). Ours: `taskclaim_worker --queue default --until-drained`, one task claimed at a "
        "time and `--batch 16`, with `TASKCLAIM_POLL_INTERVAL = 0.01` (a worker that finds nothing while others "
        "still hold tasks looks again after it). The peers at their best: django-tasks-db's `db_worker --interval 0 "
        "--no-startup-delay --batch` with each queue filter (its queue, or `*`); django-ox's `ox_worker --batch` "
        f"at each `--concurrency` of {', '.join(map(str, OX_CONCURRENCY))} (threads per process), on Python 3.12 "
        "and Django 6.1. In each round the best configuration of a system is its figure; the targets take the "
        "lowest per-round ratio.",
        "",
        "| system | configuration | tasks/s (best round) | every round | duplicates |",
        "|---|---|---:|---|---:|",
    ]
    for label, runs in t.drain_runs.items():
        lines.append(f"| {SYSTEMS[t.system_of[label]].name} | {label} | {max(runs):,.0f} "
                     f"| {', '.join(f'{v:,.0f}' for v in runs)} | {t.duplicates.get(label, 0)} |")
    lines += [
        "",
        f"*Bulk enqueue*: {t.bulk_tasks:,} enqueues of the no-op task in one `transaction.atomic()`, timed from "
        "its start to its commit, after one enqueue rolled back (code paths and statements warm); through "
        "`Task.enqueue()`, and through a system's own bulk call where it has one: django-taskclaim's "
        "`django_taskclaim.tasks.enqueue_many` (one multi-row INSERT per 1,000 tasks), django-ox's "
        "`django_ox.bulk.enqueue_many` (`bulk_create` in chunks of 1,000). Each call returns every task's "
        "`TaskResult`.",
        "",
        "| system | how | seconds (best round) | tasks/s | every round (s) |",
        "|---|---|---:|---:|---|",
    ]
    for label, runs in t.bulk_runs.items():
        lines.append(f"| {SYSTEMS[t.system_of[label]].name} | {label} | {min(runs):.2f} "
                     f"| {t.bulk_tasks / min(runs):,.0f} | {', '.join(f'{s:.2f}' for s in runs)} |")
    lines.append("")
    for key, why in t.skipped.items():
        lines.append(f"- **{SYSTEMS[key].name}** (`{SYSTEMS[key].backend}`): not measured: {why}")
    for key, found in t.versions.items():
        if key not in t.skipped:
            lines.append(f"- {SYSTEMS[key].name}: {_versions(found)}")
    lines.append("")
    return lines
