"""The I/O-bound phase in the Markdown report: its targets and its section."""

from __future__ import annotations

from .results import IoResults
from .tasks_systems import OURS, OX, SYSTEMS

Row = tuple[str, str, str, bool | None]
#: ours / django-ox, and ours / the ideal, per round (issue 32 item 8).
PEER_TARGET, IDEAL_TARGET = 2.0, 0.8
KIND_NAMES = {"sync": "sync tasks (`time.sleep`)", "async": "async tasks (`asyncio.sleep`)"}


def runs(t: IoResults, key: str, kind: str) -> list[float]:
    """Every round's rate (tasks/s) of system ``key`` draining tasks of ``kind``."""
    return next((t.drain_runs.get(label, []) for label, k in t.system_of.items()
                 if k == key and t.kind_of.get(label) == kind), [])


def limit(t: IoResults) -> float:
    """The most the waits allow: W × C tasks every ``wait`` seconds."""
    return t.workers * t.concurrency / t.wait if t.wait else 0.0


def ideal(t: IoResults) -> list[float]:
    """Per round, the ideal: min(W × C / wait, our no-op drain rate in the same configuration)."""
    return [min(limit(t), noop) for noop in runs(t, OURS, "noop")]


def _spread(ratios: list[float]) -> str:
    low, high = min(ratios), max(ratios)
    return f"{low:.2f}" if low == high else f"{low:.2f} (max {high:.2f})"


def _row(name: str, t: IoResults, ours: list[float], other: list[float], threshold: float,
         missing: list[str]) -> Row:
    """The lowest per-round ratio decides, or why it could not be taken."""
    ratios = [a / b for a, b in zip(ours, other, strict=False) if b]
    whys = [f"{SYSTEMS[k].name}: {t.skipped[k]}" for k in missing if k in t.skipped]
    if whys or not ratios:
        return name, f"not measured ({'; '.join(whys) or 'no rounds'})", f"≥ {threshold:.2f}", None
    return name, _spread(ratios), f"≥ {threshold:.2f}", min(ratios) >= threshold


def _what(t: IoResults) -> str:
    return (f"I/O-bound drain of {t.tasks:,} {{}} of {t.wait * 1e3:g} ms, {t.workers} processes × "
            f"concurrency {t.concurrency}")


def targets(t: IoResults) -> list[Row]:
    if not t.system_of and not t.skipped:
        return []
    rows: list[Row] = []
    for kind, name in KIND_NAMES.items():
        what = _what(t).format(name)
        rows.append(_row(f"{what}, django-taskclaim / django-ox", t, runs(t, OURS, kind), runs(t, OX, kind),
                         PEER_TARGET, [OURS, OX]))
        if bound := reachable(t, kind):
            rows.append((f"{what}, ideal / django-ox: the most any system can be over django-ox", _spread(bound),
                         f"≥ {PEER_TARGET:.2f} for the target to be reachable", None))
        rows.append(_row(f"{what}, django-taskclaim / ideal min({limit(t):,.0f}/s, its no-op drain at "
                         f"{t.workers} × {t.concurrency})", t, runs(t, OURS, kind), ideal(t), IDEAL_TARGET, [OURS]))
    if t.duplicates:
        dups = sum(t.duplicates.values())
        rows.append(("duplicate executions, I/O-bound drain, every system", str(dups), "= 0", dups == 0))
    for key in (OURS, OX):
        if key in t.memory:
            rows.append((f"memory per async task in flight ({t.inflight} in one worker process), {SYSTEMS[key].name}",
                         f"{t.memory[key]['per_task_kib']:,.1f} KiB", "report", None))
    if OURS in t.statements:
        rows.append((f"statements/s on the task table at {t.inflight} tasks in flight in one worker process, "
                     f"django-taskclaim (lease {t.lease:g} s; one heartbeat per task: {heartbeats(t):,.0f}/s)",
                     f"{sum(t.statements[OURS].values()):,.2f}", "report", None))
    return rows


def reachable(t: IoResults, kind: str) -> list[float]:
    """Per round, the ideal over django-ox's rate: the most ours / django-ox can be, since no system
    drains faster than the ideal. Below :data:`PEER_TARGET` the peer target cannot be met that round."""
    return [i / o for i, o in zip(ideal(t), runs(t, OX, kind), strict=False) if o]


def unreachable(t: IoResults) -> list[str]:
    """A sentence per kind whose peer target no system could meet in some round: 2 × django-ox's rate
    above the ideal."""
    said = []
    for kind, name in KIND_NAMES.items():
        rounds = [(n + 1, o, i) for n, (i, o) in enumerate(zip(ideal(t), runs(t, OX, kind), strict=False))
                  if PEER_TARGET * o > i]
        if rounds:
            said.append(f"The ≥ {PEER_TARGET:g}× django-ox target for {name} cannot be met in round(s) "
                        + ", ".join(f"{n} ({PEER_TARGET:g} × {o:,.0f}/s = {PEER_TARGET * o:,.0f}/s > the ideal "
                                    f"{i:,.0f}/s)" for n, o, i in rounds)
                        + ": no system drains faster than the ideal.")
    return said


def heartbeats(t: IoResults) -> float:
    """Statements per second of one heartbeat per task in flight, every third of the lease."""
    return t.inflight / (t.lease / 3) if t.lease else 0.0


def section(t: IoResults) -> list[str]:
    """The phase's Markdown lines (none when the phase did not run)."""
    if not t.system_of and not t.skipped:
        return []
    lines = [
        f"## I/O-bound drain: {t.tasks:,} tasks of {t.wait * 1e3:g} ms at {t.workers} × {t.concurrency} in flight; "
        f"{t.inflight} tasks in flight in one worker",
        "",
        f"Each task waits {t.wait * 1e3:g} ms, as a call to a model or a remote service does: a sync task in "
        f"`time.sleep`, an async one in `asyncio.sleep` (`benchmarks/io_tasks.py`). {t.tasks:,} of one kind are "
        "enqueued through `Task.enqueue()` (untimed, then `VACUUM ANALYZE`) and drained by the system's own worker "
        f"command in {t.workers} processes of {t.concurrency} tasks in flight each, started, set up and released "
        "together; the rate is the task count over the span from the first worker's start to the last one's exit, "
        "every execution counted. Ours: `taskclaim_worker --queue default --until-drained --concurrency "
        f"{t.concurrency}` (sync tasks on a pool of threads, async ones on one event loop, their ORM calls on a "
        "few database threads; its default batch at that concurrency), with "
        "`TASKCLAIM_POLL_INTERVAL = 0.01`; django-ox: `ox_worker --batch --concurrency "
        f"{t.concurrency}` (a pool of threads, an async task on an event loop of its own in its thread, asgiref's "
        f"`async_to_sync`), on Python 3.12 and Django 6.1. The ideal is min({t.workers} × {t.concurrency} / "
        f"{t.wait:g} s = {limit(t):,.0f}/s, ours draining no-op tasks in the same configuration in the same round): "
        "the waits' limit, or what its commits allow. Interleaved rounds; the targets take the lowest per-round "
        "ratio.",
        "",
        "| system | configuration | tasks/s (best round) | every round | duplicates |",
        "|---|---|---:|---|---:|",
    ]
    for label, values in t.drain_runs.items():
        lines.append(f"| {SYSTEMS[t.system_of[label]].name} | {label} | {max(values):,.0f} "
                     f"| {', '.join(f'{v:,.0f}' for v in values)} | {t.duplicates.get(label, 0)} |")
    if ideal(t):
        lines += ["", "Ideal per round (tasks/s): " + ", ".join(f"{v:,.0f}" for v in ideal(t)) + "."]
        for sentence in unreachable(t):
            lines += ["", sentence]
    lines += [
        "",
        f"*Tasks in flight*: one worker process with `--concurrency {t.inflight}` (and a lease of {t.lease:g} s: "
        f"renewed every {t.lease / 3:g} s) runs one async task (code paths warm), then takes {t.inflight} async "
        "tasks that wait on the event loop until the driver lets them go. *Idle*: the median of its RSS "
        "(`VmRSS` of `/proc/PID/status`) over 1 s before they are enqueued; *loaded*: the highest over the "
        f"{t.window:g} s window once all {t.inflight} are RUNNING in its table and started (ours: a claim "
        "reserved until its slot starts it counts its attempt then), and still are at its end; per "
        f"task: (loaded − idle) / {t.inflight}. *Statements/s*: the calls counted by `pg_stat_statements` over "
        "the window, of every statement that names the system's task table (the driver sends none meanwhile), "
        f"beside one heartbeat per task every third of the lease ({t.inflight} / {t.lease / 3:g} s = "
        f"{heartbeats(t):,.0f}/s), which batched renewals replace.",
        "",
        "| system | RSS idle (MiB) | RSS loaded (MiB) | per task in flight (KiB) | statements/s on its task table |",
        "|---|---:|---:|---:|---:|",
    ]
    for key in (OURS, OX):
        if key in t.memory:
            m = t.memory[key]
            stmts = f"{sum(t.statements[key].values()):,.2f}" if key in t.statements else "not counted"
            lines.append(f"| {SYSTEMS[key].name} | {m['idle_kib'] / 1024:,.1f} | {m['loaded_kib'] / 1024:,.1f} "
                         f"| {m['per_task_kib']:,.1f} | {stmts} |")
        elif key in t.inflight_skipped or key in t.skipped:
            why = t.inflight_skipped.get(key) or t.skipped[key]
            lines.append(f"| {SYSTEMS[key].name} | not measured: {why} | | | |")
    lines.append("")
    for key, rates in t.statements.items():
        if rates:
            lines.append(f"Statements of {SYSTEMS[key].name} per second: "
                         + "; ".join(f"{rate:,.2f}/s `{_short(query)}`" for query, rate in rates.items()) + ".")
            lines.append("")
    if t.statements_skipped:
        lines += [f"Statements not counted: {t.statements_skipped}.", ""]
    for key, why in t.skipped.items():
        lines.append(f"- **{SYSTEMS[key].name}**: not measured: {why}")
    for key, found in t.versions.items():
        if key not in t.skipped:
            lines.append(f"- {SYSTEMS[key].name}: " + ", ".join(
                f"{'Python' if k == 'python' else k} {v}" for k, v in found.items()))
    lines.append("")
    return lines


def _short(query: str, width: int = 110) -> str:
    text = query.replace("`", "'")
    return text if len(text) <= width else text[:width - 1] + "…"
