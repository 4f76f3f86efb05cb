"""One run, from options to exit status: set up, inject, go quiet, check, report."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from tests.chaos.checker import Verdict, check, load_state, recovery, table
from tests.chaos.downstream import check_downstream, load_outbox
from tests.chaos.harness import Harness, Options
from tests.chaos.limits import check_limits, limit_lines
from tests.chaos.ticks import check_ticks, tick_lines

HarnessT = TypeVar("HarnessT", bound=Harness)


def run(args: argparse.Namespace) -> int:
    for mode in ("downstream", "limits", "schedules"):
        if args.celery and getattr(args, mode):
            print(f"error: --{mode} runs the harness's own workers, not --celery", file=sys.stderr)
            return 2
    if args.celery:
        from tests.chaos.celery_run import run_celery

        return run_celery(args)
    opts = Options(
        duration=args.duration, workers=args.workers, seed=args.seed, db=args.db,
        lease=args.lease, tasks=args.tasks, steps=args.steps, work_ms=args.work_ms,
        fault_interval=args.fault_interval, crash=args.crash, give_up=args.give_up,
        skew=args.skew, quiet=args.quiet,
        faults=args.faults, failover_interval=args.failover_interval, replication=args.replication,
        standby_lag=args.standby_lag, ha=args.ha, ha_failures=args.ha_failures,
        concurrency=args.concurrency,
        downstream=args.downstream, relays=args.relays,
        limits=args.limits, limit_keys=args.limit_keys, limit=args.limit,
        schedules=args.schedules, schedulers=args.schedulers,
        unsafe=args.unsafe, keep=args.keep, verbose=args.verbose,
    )
    harness = build(Harness, opts)
    if harness is None:
        return 2

    failing_over = "failover" in harness.kinds
    topology = (f", a primary and {'an asynchronous' if opts.replication == 'async' else 'a synchronous'} standby"
                + (f" {opts.standby_lag * 1000:g} ms behind" if opts.standby_lag else "")
                if failing_over else "")
    if failing_over and opts.ha == "patroni":
        topology = (", Patroni (etcd, three members" + (", synchronous_mode" if opts.replication == "sync" else "")
                    + ")")

    def render(verdict: Verdict) -> str:
        log = harness.log
        header = (f"django-taskclaim fault injection: {opts.db}{topology}, seed {opts.seed}, "
                  f"{opts.workers} workers, lease {opts.lease} s, {log.chaos_seconds:.0f} s of "
                  f"faults + {log.quiet_seconds:.0f} s quiet, {log.workers_started} workers")
        rows = recovery(log.failovers, log.events, opts.lease, verdict.lost_seen) if failing_over else None
        report["failovers"] = rows
        text = table(log.faults, verdict, header, harness.kinds, harness.skew_available, opts.crash, rows)
        if opts.schedules:
            report.update(first_tick=str(log.first_tick), until_tick=str(log.until_tick))
        # The sections of the modes go with the run's figures, before the violations.
        sections = "".join([
            downstream_lines(harness, verdict) if opts.downstream else "",
            limit_lines(verdict.figures, opts.limit_keys, opts.limit) if opts.limits else "",
            tick_lines(verdict.figures, opts.schedulers, log.first_tick, log.until_tick) if opts.schedules else "",
        ])
        return text.replace("\n\nviolations\n", sections + "\n\nviolations\n", 1)

    report: dict[str, Any] = {"kinds": harness.kinds}
    if failing_over:
        report.update(replication=opts.replication, standby_lag=opts.standby_lag)
    return drive(harness, args, render,
                 banner=f"chaos on {opts.db}{topology}: {opts.workers} workers, lease {opts.lease} s, "
                        f"{opts.duration:.0f} s of faults, seed {opts.seed}",
                 report=report)


DOWNSTREAM_LABELS = (
    ("outbox_messages", "outbox messages recorded"),
    ("outbox_deliveries", "deliveries attempted by the relays"),
    ("outbox_claimed_again", "  messages claimed by a relay more than once"),
    ("relay_kills", "relays SIGKILLed"),
    ("relay_pauses", "relays SIGSTOPped past their lease"),
    ("relay_exits", "relays that exited on their own (replaced)"),
    ("downstream_outbox_effects", "outbox effects taken downstream"),
    ("direct_calls", "direct calls with claim.headers()"),
    ("direct_calls_201", "  answered 201 (first call or replay)"),
    ("direct_calls_replayed", "    of which replayed (Idempotent-Replayed: true)"),
    ("direct_calls_refused_409", "  refused 409 (a newer owner had called)"),
    ("direct_calls_other", "  other answers or no answer"),
    ("downstream_direct_effects", "direct effects taken downstream"),
    ("downstream_lost", "downstream effects lost"),
    ("downstream_twice", "downstream effects taken twice"),
)


def downstream_lines(harness: Harness, verdict: Verdict) -> str:
    """The downstream's section of the table (its violations are in the table's own list)."""
    lines = ["", f"downstream ({harness.opts.relays} relays, {harness.downstream_url})"]
    lines += [f"  {label:<56} {verdict.figures.get(name, 0):>8}" for name, label in DOWNSTREAM_LABELS]
    return "\n".join(lines)


def build(factory: Callable[[Options], HarnessT], opts: Options) -> HarnessT | None:
    """The harness, or ``None`` after saying why it cannot run (exit status 2)."""
    try:
        return factory(opts)
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def merge(verdict: Verdict, figures: dict[str, int], found: dict[str, list[str]]) -> None:
    """Add a mode's figures and violations to the run's verdict."""
    verdict.figures.update(figures)
    for kind, items in found.items():
        for item in items:
            verdict.add(kind, item)


def drive(harness: Harness, args: argparse.Namespace, render: Callable[[Verdict], str], *,
          banner: str, report: dict[str, Any]) -> int:
    """Set up, inject faults, go quiet, check and report; the exit status (0 ok, 1 violation)."""
    opts, ok = harness.opts, False
    try:
        print(banner, flush=True)
        harness.setup()
        harness.chaos()
        print(f"  quiet period (faults stopped after {harness.log.chaos_seconds:.0f} s) ...",
              flush=True)
        harness.quiet()
        log = harness.log
        state = harness.db(load_state)
        verdict = check(state, log.events, log.enqueued, log.killed_pids)
        if opts.downstream:
            outbox = harness.db(load_outbox)
            figures, found = check_downstream(state["tasks"], outbox, log.downstream_effects,
                                              log.events, log.enqueued)
            verdict.figures.update(figures, relay_exits=log.relay_exits,
                                   relay_kills=log.faults["relay_kill"],
                                   relay_pauses=log.faults["relay_pause"])
            for kind, items in found.items():
                for item in items:
                    verdict.add(kind, item)
        if opts.limits:
            merge(verdict, *check_limits(state["tasks"], state["effects"]))
        if opts.schedules:
            merge(verdict, *check_ticks(state["tasks"], state["attempts"], state["effects"],
                                        log.first_tick, log.until_tick, log.ticks_reported))
            verdict.figures.update(scheduler_kills=log.faults["scheduler_kill"],
                                   scheduler_pauses=log.faults["scheduler_pause"],
                                   scheduler_outages=log.faults["scheduler_outage"],
                                   skewed_schedulers=log.faults["skewed_scheduler"])
        for error in log.errors:
            verdict.add("harness", error)
        print(render(verdict), flush=True)
        ok = verdict.ok
        if args.report:
            with open(args.report, "w") as f:
                json.dump({"seed": opts.seed, "db": opts.db, "ok": ok, **report,
                           "faults": dict(log.faults), "figures": verdict.figures,
                           "violations": {k: v for k, v in verdict.violations.items() if v}},
                          f, indent=1)
        return 0 if ok else 1
    finally:
        harness.teardown(ok)
