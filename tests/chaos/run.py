"""One run, from options to exit status: set up, inject, go quiet, check, report."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from tests.chaos.checker import Verdict, check, load_state, recovery, table
from tests.chaos.harness import Harness, Options

HarnessT = TypeVar("HarnessT", bound=Harness)


def run(args: argparse.Namespace) -> int:
    if args.celery:
        from tests.chaos.celery_run import run_celery

        return run_celery(args)
    opts = Options(
        duration=args.duration, workers=args.workers, seed=args.seed, db=args.db,
        lease=args.lease, tasks=args.tasks, steps=args.steps, work_ms=args.work_ms,
        fault_interval=args.fault_interval, crash=args.crash, give_up=args.give_up,
        skew=args.skew, quiet=args.quiet,
        faults=args.faults, failover_interval=args.failover_interval, replication=args.replication,
        standby_lag=args.standby_lag, concurrency=args.concurrency,
        unsafe=args.unsafe, keep=args.keep, verbose=args.verbose,
    )
    harness = build(Harness, opts)
    if harness is None:
        return 2

    failing_over = "failover" in harness.kinds
    topology = (f", a primary and {'an asynchronous' if opts.replication == 'async' else 'a synchronous'} standby"
                + (f" {opts.standby_lag * 1000:g} ms behind" if opts.standby_lag else "")
                if failing_over else "")

    def render(verdict: Verdict) -> str:
        log = harness.log
        header = (f"django-taskclaim fault injection: {opts.db}{topology}, seed {opts.seed}, "
                  f"{opts.workers} workers, lease {opts.lease} s, {log.chaos_seconds:.0f} s of "
                  f"faults + {log.quiet_seconds:.0f} s quiet, {log.workers_started} workers")
        rows = recovery(log.failovers, log.events, opts.lease, verdict.lost_seen) if failing_over else None
        report["failovers"] = rows
        return table(log.faults, verdict, header, harness.kinds, harness.skew_available, opts.crash, rows)

    report: dict[str, Any] = {"kinds": harness.kinds}
    if failing_over:
        report.update(replication=opts.replication, standby_lag=opts.standby_lag)
    return drive(harness, args, render,
                 banner=f"chaos on {opts.db}{topology}: {opts.workers} workers, lease {opts.lease} s, "
                        f"{opts.duration:.0f} s of faults, seed {opts.seed}",
                 report=report)


def build(factory: Callable[[Options], HarnessT], opts: Options) -> HarnessT | None:
    """The harness, or ``None`` after saying why it cannot run (exit status 2)."""
    try:
        return factory(opts)
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


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
