"""The Markdown report and the PNG chart of a benchmark run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .results import Results, Sizes

from . import iodrain_report, latency, tasks_report
from .outbox_phase import markdown as outbox_markdown
from .results import APP_DRAIN, RAW_BATCH_DRAIN, RAW_DRAIN, WORKER_BATCH, WORKER_DRAIN
from .steps_phase import markdown as steps_markdown
from .steps_phase import targets as steps_targets

APP = APP_DRAIN  # every configuration of ours in the drain is named APP…


METHODOLOGY = (
    '- **Same server, same run.** Every system talks to one PostgreSQL server (`fsync=on`, '
    '`full_page_writes=on` with `--start-server`); ratios are taken between systems measured back to '
    'back.'
    "\n"
    '- **Peers at their best.** Every Django-based system (django-taskclaim, django-tasks-db) runs with '
    'persistent connections (`CONN_MAX_AGE=None` in `benchmarks/settings.py`); procrastinate runs at each'
    ' concurrency of `Sizes.procrastinate_concurrency`, django-tasks-db\'s `db_worker` loop with no sleep '
    '(`--interval 0`), no startup delay, and each queue filter of `Sizes.dtdb_queues` (its own queue, or '
    '`*`); in every round the best configuration of each peer is its figure.'
    "\n"
    '- **Baselines.** *minimal*: the simplest correct hand-written claim in plain psycopg, autocommit '
    '(`INSERT … ON CONFLICT (tenant, key) DO UPDATE … WHERE claimable RETURNING id, fencing_token`, then '
    "`UPDATE … WHERE id = … AND fencing_token = …`); *raw*: the app's own statements sent by psycopg "
    "(checked identical); *commit limit*: a loop of the drain's statements in psycopg, one commit per "
    'task.'
    "\n"
    '- **Repeats.** Each comparison runs `Sizes.rounds` (3) interleaved rounds, the systems of a round '
    'back to back; every target is the **lowest** of its per-round ratios (the highest is shown beside '
    'it), and the tables give the best round of each system.'
    "\n"
    '- **Load.** Before and after each phase the run samples, for one second while it is idle, the CPU '
    'time other work takes, and during each phase the time a hypervisor withholds (steal); more than a '
    'quarter of the CPUs busy, or 5 % stolen, is recorded as a warning at the top: such a run is not a '
    'record.'
    "\n"
    '- **No timed assertions in CI.** `tests/repository/test_benchmarks.py` runs `--smoke` and checks only the '
    "report's structure, zero duplicates and one winner per key."
    "\n"
)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b


def _fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _bykey_rounds(r: Results, system: str, w: int) -> list[float]:
    """Every round's by-key throughput of ``system`` at ``w`` workers."""
    return r.bykey_runs.get(system, {}).get(w, [])


def round_ratios(r: Results, baseline: str, w: int, system: str = "app") -> tuple[float | None, float | None]:
    """(min, max) over rounds of ``system`` / ``baseline`` by-key throughput, each round's pair run back to back."""
    return _spread(_per_round(_bykey_rounds(r, system, w), _bykey_rounds(r, baseline, w)))


def _spread(ratios: list[float]) -> tuple[float | None, float | None]:
    return (min(ratios), max(ratios)) if ratios else (None, None)


def _per_round(a: list[float], b: list[float]) -> list[float]:
    """``a[i] / b[i]`` for every round ``i`` both were measured in (back to back)."""
    return [x / y for x, y in zip(a, b, strict=False) if y]


def _best_per_round(r: Results, prefix: str, w: int) -> list[float]:
    """Per round, the best of the systems named ``prefix…`` (a peer's configurations) at ``w``."""
    runs = [v[w] for k, v in r.drain_runs.items() if k.startswith(prefix) and w in v]
    return [max(column) for column in zip(*runs, strict=False)] if runs else []


def _lowest(ratios: list[float]) -> str:
    """The lowest per-round ratio, with the highest beside it when they differ."""
    low, high = _spread(ratios)
    return _fmt_ratio(low) if low == high else f"{_fmt_ratio(low)} (max {_fmt_ratio(high)})"


def _target(name: str, ratios: list[float], threshold: float, at_least: bool) -> tuple[str, str, str, bool | None]:
    """A target row: the lowest per-round ratio decides (the issue's rule), the highest is shown."""
    low, _ = _spread(ratios)
    met = None if low is None else (low >= threshold if at_least else low <= threshold)
    return name, _lowest(ratios), f"{'≥' if at_least else '≤'} {threshold:.2f}", met


def _report(name: str, ratios: list[float]) -> tuple[str, str, str, bool | None]:
    """A row reported beside the targets (no threshold)."""
    return name, _lowest(ratios), "report", None


def _size_kinds(r: Results) -> list[tuple[str, str]]:
    """The table-size phase's p50 figures and their names."""
    queues = f"{r.size_queues} queues" if r.size_queues else "several queues"
    return [("bykey_p50", "by-key claim"), ("queue_p50", f"claim_next, one queue at a time ({queues} in use)"),
            ("queues_p50", f"claim_next over all {queues} at once")]


def targets(r: Results) -> list[tuple[str, str, str, bool | None]]:
    """(target, measured, threshold, met) for each target of the issue; each the minimum over rounds."""
    out: list[tuple[str, str, str, bool | None]] = []
    w = 4 if 4 in r.bykey["app"] else max(r.bykey["app"], default=None)
    if w is not None:
        app, minimal = _bykey_rounds(r, "app", w), _bykey_rounds(r, "minimal", w)
        out.append(_target(f"by-key claim + complete at W={w}, app / minimal hand-written claim",
                           _per_round(app, minimal), 0.6, True))
        out.append(_target(f"by-key claim + complete at W={w}, app / raw (the same SQL in psycopg)",
                           _per_round(app, _bykey_rounds(r, "raw", w)), 0.6, True))
        lean = _bykey_rounds(r, "app_noaudit", w)
        if lean:
            out.append(_target(f"by-key claim + complete at W={w}, app with TASKCLAIM_AUDIT = False (no audit "
                               f"rows, like the minimal claim) / minimal hand-written claim",
                               _per_round(lean, minimal), 0.6, True))
    ours = r.drain_runs.get(APP, {})
    wd = 4 if 4 in ours else max(ours, default=None)
    if wd is not None:
        best_ours = _best_per_round(r, APP, wd)  # per round, the better of the loop and the batching worker
        worker = WORKER_DRAIN in r.drain_runs
        mine = f"django-taskclaim at its best (one-task loop or worker batch {WORKER_BATCH})" if worker \
            else "django-taskclaim"
        for peer, label in (("procrastinate", "procrastinate (best concurrency)"),
                            ("django-tasks-db", "django-tasks-db (best queue filter)")):
            best = _best_per_round(r, peer, wd)
            if best:
                out.append(_target(f"queue drain at W={wd}, {mine} vs {label}", _per_round(best_ours, best),
                                   2.0, True))
                if worker:
                    out.append(_report(f"queue drain at W={wd}, the one-task loop alone vs {label}",
                                       _per_round(ours[wd], best)))
        for system, limit, label in ((APP, RAW_DRAIN, "the one-task loop"),
                                     (WORKER_DRAIN, RAW_BATCH_DRAIN, f"the worker, batch {WORKER_BATCH}")):
            if system in r.drain_runs and limit in r.drain_runs:
                out.append(_report(f"queue drain at W={wd}, {label}, as a fraction of the commit limit "
                                   "(same statements, psycopg)",
                                   _per_round(r.drain_runs[system].get(wd, []), r.drain_runs[limit].get(wd, []))))
        dups = sum(sum(v.values()) for v in r.duplicates.values())
        out.append(("duplicate executions, every system and W", str(dups), "= 0", dups == 0))
    if len(r.size_runs) >= 2:
        small, large = min(r.size_runs), max(r.size_runs)
        for key, label in _size_kinds(r):
            ratios = _per_round([run[key] for run in r.size_runs[large]], [run[key] for run in r.size_runs[small]])
            out.append(_target(f"{label} p50 at {large:,} finished rows / at {small:,}", ratios, 1.3, False))
    if r.race_runs.get("contended") and r.race_runs.get("raw_contended"):
        ratios = _per_round([p99 for _, p99 in r.race_runs["contended"]],
                            [p99 for _, p99 in r.race_runs["raw_contended"]])
        racers = int(r.race.get("racers", 32))
        out.append(_target(f"{racers} racers on one key: contended p99 / the bare claim statement's contended p99",
                           ratios, 1.5, False))
    out.extend(tasks_report.targets(r.tasks))
    out.extend(iodrain_report.targets(r.iodrain))
    out.extend(steps_targets(r.steps))
    return out


def markdown(r: Results, sizes: Sizes, *, smoke: bool) -> str:
    lines: list[str] = []
    add = lines.append
    add("# Benchmarks" + (" (smoke size: not figures to quote)" if smoke else ""))
    add("")
    add("Measured by `python -m benchmarks` (see `benchmarks/__main__.py`). All systems ran on the same "
        "machine, against the same PostgreSQL server, in the same run; compare the ratios, not the "
        "absolute figures, which drift on shared machines.")
    add("")
    add("Reproduce with `pip install -e '.[bench]'` then `python -m benchmarks --start-server` (a private "
        "PostgreSQL with `fsync=on` and `full_page_writes=on`) or `python -m benchmarks --pg-url URL`; "
        "`--smoke` runs tiny sizes without the peers in seconds (CI does, in `tests/repository/test_benchmarks.py`), "
        "`--max-rows` caps the table-size phase, `--drain-tasks` the queue drain, `--tasks-drain` the Django Tasks "
        "phase's drain, `--io-tasks` and `--io-concurrency` the I/O-bound phase's, `--phases` picks phases "
        "(`--smoke` leaves out the Django Tasks and I/O-bound phases unless named).")
    add("")
    if r.warnings:
        add("> **The machine was too busy to conclude.** " + " ".join(r.warnings))
        add("")
    add("## Methodology")
    add("")
    add(METHODOLOGY)
    add("## Environment")
    add("")
    for name, value in r.env.items():
        add(f"- **{name}**: `{value}`" if name == "command" else f"- **{name}**: {value}")
    add("")
    add("## Targets")
    add("")
    add("| target | measured | threshold | met |")
    add("|---|---:|---:|:---:|")
    for name, measured, threshold, met in targets(r):
        add(f"| {name} | {measured} | {threshold} | {'n/a' if met is None else ('yes' if met else '**no**')} |")
    add("")
    if r.bykey["app"]:
        add("## By-key claim + complete (claims/s)")
        add("")
        add(f"Each worker process claims a fresh key and completes it, in a loop, for {sizes.bykey_seconds:g} s. "
            "*raw* sends the very statements of `django_taskclaim/store/postgresql.py` (the run checks "
            "they are identical, captured with `connection.execute_wrapper`) with plain psycopg, no ORM: "
            "autocommit, server-side parameter binding and psycopg's automatic prepared statements. The app "
            "goes through `Task.objects.claim()` and `Claim.complete()` on Django's connection (its own "
            "server-binding cursor, statements prepared once per session). Audit trail on: one round trip "
            "per claim and per completion. "
            "*minimal* is the simplest correct claim a user would hand-write in plain psycopg "
            "(autocommit, no audit rows): `INSERT … ON CONFLICT (tenant, key) DO UPDATE … WHERE claimable "
            "RETURNING id, fencing_token`, then `UPDATE … WHERE id = … AND fencing_token = …` "
            "(`benchmarks/workers.py`, `MINIMAL_CLAIM_SQL`). *app, audit off* is the app with "
            "`TASKCLAIM_AUDIT = False`: no attempt rows, like the minimal claim. Best round of each; the "
            "ratios give the lowest and highest of the rounds (each round runs the four back to back).")
        add("")
        add("| W | minimal | raw SQL | django-taskclaim | app/minimal (min–max) | app/raw "
            "| app, audit off | audit off/minimal (min–max) |")
        add("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for w in sorted(r.bykey["app"]):
            raw, app, low = r.bykey["raw"].get(w), r.bykey["app"].get(w), r.bykey["minimal"].get(w)
            lean = r.bykey.get("app_noaudit", {}).get(w)
            lo, hi = round_ratios(r, "minimal", w)
            llo, lhi = round_ratios(r, "minimal", w, system="app_noaudit")
            add(f"| {w} | {low or 0:,.0f} | {raw or 0:,.0f} | {app or 0:,.0f} "
                f"| {_fmt_ratio(lo)}–{_fmt_ratio(hi)} | {_fmt_ratio(_ratio(app, raw))} "
                f"| {lean or 0:,.0f} | {_fmt_ratio(llo)}–{_fmt_ratio(lhi)} |")
        add("")
    if r.drain:
        add(f"## Queue drain of {sizes.drain_tasks:,} no-op tasks (tasks/s)")
        add("")
        add("Each system drains the same number of no-op jobs with its own workers (W processes), from "
            "the first worker's start to the last worker's exit. Every worker counts the jobs it executed; "
            "*duplicates* is executions minus distinct jobs (must be 0), and every job must have run. "
            "*django-taskclaim* is the one-task loop on `Claim.complete_and_claim_next()`: one statement "
            f"and one commit per task. *{WORKER_DRAIN}* is the worker helper as users run it "
            f"(`work(handler, batch={WORKER_BATCH})`, as `manage.py taskclaim_worker --batch {WORKER_BATCH}`): "
            f"each task under `keepalive()`, {WORKER_BATCH} claimed at a time, the others' completions "
            "plain and the last one claiming the next batch, still one commit per task. *commit limit* "
            "sends the same statements with plain psycopg in autocommit (one-task, and batched as the "
            "worker): the most this server does at one commit per task. Each figure is the best of "
            f"{sizes.rounds} interleaved rounds; the spread table below lists every round.")
        add("")
        systems = list(r.drain)
        ws = sorted({w for v in r.drain.values() for w in v})
        add("| W | " + " | ".join(systems) + " |")
        add("|---:|" + "---:|" * len(systems))
        for w in ws:
            add(f"| {w} | " + " | ".join(f"{r.drain[s][w]:,.0f}" if w in r.drain[s] else "–" for s in systems) + " |")
        add("| duplicates | " + " | ".join(str(sum(r.duplicates.get(s, {}).values())) for s in systems) + " |")
        add("")
        # Ours: the better of our configurations at each W (best rounds), against every other system.
        ours = {w: max(v[w] for k, v in r.drain.items() if k.startswith(APP) and w in v) for w in ws
                if any(k.startswith(APP) and w in v for k, v in r.drain.items())}
        others = [s for s in systems if not s.startswith((APP, "commit limit"))]  # the peers
        if others:
            add("| W | " + " | ".join(f"taskclaim (best) / {s}" for s in others) + " |")
            add("|---:|" + "---:|" * len(others))
            for w in ws:
                add(f"| {w} | " + " | ".join(_fmt_ratio(_ratio(ours.get(w), r.drain[s].get(w))) for s in others)
                    + " |")
            add("")
    if r.drain_runs:
        add("Every round (tasks/s, min – max):")
        add("")
        for name, per_w in r.drain_runs.items():
            spread = ", ".join(f"W={w}: {min(v):,.0f} – {max(v):,.0f}" for w, v in sorted(per_w.items()))
            add(f"- {name}: {spread}")
        add("")
    lines.extend(tasks_report.section(r.tasks))
    lines.extend(iodrain_report.section(r.iodrain))
    if r.sizes:
        add("## Claim latency by table size (ms)")
        add("")
        nq, samples = sizes.size_queues, sizes.latency_samples
        add(f"Finished (succeeded) rows bulk-generated with `generate_series`, then `VACUUM ANALYZE`: queued work "
            f"spread over {nq} queues and five priorities (−20 to 20), one row in ten claimed by key (no queue). "
            f"Then one process takes {samples:,} by-key claims of fresh keys, {samples:,} `claim_next(queue=Q)` "
            f"claims, Q each of the {nq} queues in turn, and {samples:,} `claim_next(queue=[all {nq}])` claims "
            f"(each claim completed, untimed), from {2 * samples:,} pending tasks spread likewise over the queues "
            f"and priorities, beside {25 * nq} deferred ones (not due for a day) at every priority, which the "
            "claims pass over.")
        add("")
        add("| finished rows | generated in | by-key p50 | by-key p99 | claim_next one queue p50 | one queue p99 "
            f"| claim_next {nq} queues p50 | {nq} queues p99 |")
        add("|---:|---:|---:|---:|---:|---:|---:|---:|")
        kinds = ("bykey_p50", "bykey_p99", "queue_p50", "queue_p99", "queues_p50", "queues_p99")
        for rows, v in sorted(r.sizes.items()):
            add(f"| {rows:,} | {r.fill_seconds.get(rows, 0):.0f} s | " + " | ".join(_ms(v[k]) for k in kinds)
                + " |")
        small, large = min(r.sizes), max(r.sizes)
        add(f"| ratio {large:,} / {small:,} | | "
            + " | ".join(_fmt_ratio(_ratio(r.sizes[large][k], r.sizes[small][k])) for k in kinds) + " |")
        add("")
        if r.size_runs.get(large):
            add(f"Each figure is the best of {len(r.size_runs[large])} rounds; the per-round ratios "
                f"{large:,} / {small:,} (by-key p50, claim_next one queue p50, {sizes.size_queues} queues p50): "
                + "; ".join(", ".join(_fmt_ratio(_ratio(a[k], b[k])) for k in ("bykey_p50", "queue_p50", "queues_p50"))
                            for a, b in zip(r.size_runs[large], r.size_runs[small], strict=False)) + ".")
            add("")
    if r.race:
        add("## Contention (ms)")
        add("")
        add(f"{sizes.racers} processes claim the same key at once (released together by a barrier), for each of "
            f"{sizes.race_keys} keys: one wins, the others get the decision that the task is running (and record "
            "a `duplicate` attempt). Decision latency is the time `Task.objects.claim()` takes to return. "
            "Uncontended: one process, the same keys, no rivals.")
        add("")
        add("| | p50 | p99 |")
        add("|---|---:|---:|")
        add(f"| uncontended | {_ms(r.race['uncontended_p50'])} | {_ms(r.race['uncontended_p99'])} |")
        add(f"| contended ({sizes.racers} racers) | {_ms(r.race['contended_p50'])} | {_ms(r.race['contended_p99'])} |")
        add(f"| ratio | {_fmt_ratio(_ratio(r.race['contended_p50'], r.race['uncontended_p50']))} "
            f"| {_fmt_ratio(_ratio(r.race['contended_p99'], r.race['uncontended_p99']))} |")
        if "raw_contended_p99" in r.race:
            add(f"| raw SQL, uncontended | {_ms(r.race['raw_uncontended_p50'])} "
                f"| {_ms(r.race['raw_uncontended_p99'])} |")
            add(f"| raw SQL, contended ({sizes.racers} racers) | {_ms(r.race['raw_contended_p50'])} "
                f"| {_ms(r.race['raw_contended_p99'])} |")
            add(f"| raw SQL ratio | {_fmt_ratio(_ratio(r.race['raw_contended_p50'], r.race['raw_uncontended_p50']))} "
                f"| {_fmt_ratio(_ratio(r.race['raw_contended_p99'], r.race['raw_uncontended_p99']))} |")
            add("")
            add("*Raw SQL* sends only the claim statement with plain psycopg (no state read, no `duplicate` "
                "record, no ORM): the floor that the database's serialisation of racing writers and the "
                "scheduling of the racing processes on this machine's cores set for the same race.")
        add("")
        if r.race_runs.get("contended"):
            add("Best round of each above; every round's contended p99 (ms), app / raw SQL: "
                + ", ".join(f"{_ms(a[1])} / {_ms(b[1])}" for a, b in zip(
                    r.race_runs["contended"], r.race_runs.get("raw_contended", []), strict=False)) + ".")
            add("")
        add(f"Exactly one winner per key; duplicate attempts recorded: {r.race.get('duplicates_recorded', 0):,} "
            f"(expected {r.race.get('duplicates_expected', 0):,}).")
        add("")
    if r.audit:
        add("## Attempt audit trail (claims/s)")
        add("")
        add(f"By-key claim + complete through the app with W = {sizes.audit_workers}, `TASKCLAIM_AUDIT` on vs off.")
        add("")
        add("| audit on | audit off | on/off |")
        add("|---:|---:|---:|")
        add(f"| {r.audit['on']:,.0f} | {r.audit['off']:,.0f} | {_fmt_ratio(_ratio(r.audit['on'], r.audit['off']))} |")
        add("")
    for line in latency.report(r.idle):
        add(line)
    lines.extend(outbox_markdown(r.outbox))
    lines.extend(steps_markdown(r.steps))
    if r.phase_seconds:
        add("Phase durations: " + ", ".join(f"{k} {v:.0f} s" for k, v in r.phase_seconds.items()) + ".")
        add("")
    return "\n".join(lines)


def chart(r: Results, path: str) -> bool:
    """Throughput by worker count for every system, and the Django Tasks phase's best rounds;
    ``False`` when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = r.tasks
    tasks_panel = bool(t.drain_runs or t.bulk_runs)
    fig, axes = plt.subplots(1, 3 if tasks_panel else 2, figsize=(18 if tasks_panel else 12, 4.8))
    panels: list[tuple[Any, str, dict[str, dict[int, float]], str]] = [
        (axes[0], "By-key claim + complete", {"django-taskclaim": r.bykey["app"], "raw SQL (psycopg)": r.bykey["raw"],
          "minimal hand-written claim": r.bykey["minimal"]},
         "claims/s"),
        (axes[1], "Queue drain of no-op tasks", r.drain, "tasks/s"),
    ]
    for ax, title, series, unit in panels:
        for name, points in series.items():
            if points:
                ws = sorted(points)
                ax.plot(ws, [points[w] for w in ws], marker="o", label=name)
        ax.set_title(title)
        ax.set_xlabel("worker processes (W)")
        ax.set_ylabel(unit)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({w for p in series.values() for w in p}) or [1])
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
    if tasks_panel:
        _tasks_panel(axes[2], t)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _tasks_panel(ax: Any, t: Any) -> None:
    """Each system's best round in the Django Tasks phase: the drain at W and the bulk enqueue."""
    from .tasks_systems import OURS, PEERS, SYSTEMS

    keys = [k for k in (OURS, *PEERS) if k in t.system_of.values()]
    drains = [max(tasks_report.drain_best(t, k), default=0.0) for k in keys]
    bulks = [max(tasks_report.bulk_best(t, k), default=0.0) / 10 for k in keys]
    xs = range(len(keys))
    ax.bar([x - 0.2 for x in xs], drains, width=0.4, label=f"drain at W={t.workers} (tasks/s)")
    ax.bar([x + 0.2 for x in xs], bulks, width=0.4, label=f"bulk enqueue of {t.bulk_tasks:,} (tasks/s ÷ 10)")
    ax.set_xticks(list(xs), [SYSTEMS[k].name for k in keys])
    ax.set_title("Django Tasks API, each system at its best (best round)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
