"""The demo from start to verdict: settings, the jobs requested, the driver's run, the summary."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .celery_driver import CeleryDriver, celery_environment
from .cli import parse_args
from .client import next_run, request_jobs
from .driver import QueueDriver
from .registry import Registry
from .report import Log, print_summary, summarize, vendor
from .work_driver import WorkerDriver


def setup_django() -> None:
    # This command is the example project's own: its settings, whatever the shell says.
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    Path(settings.ARTIFACT_DIR).mkdir(parents=True, exist_ok=True)  # var/ holds the SQLite file too
    call_command("migrate", verbosity=0)


def main(argv: list[str]) -> int:
    """Run the demo; 0 when every job took effect exactly once and nothing went wrong."""
    args = parse_args(argv)
    # The demo's short lease and simulated work, for this process and the agents it starts.
    os.environ.update(
        TESTGEN_LEASE=str(args.lease),
        TESTGEN_WORK_SECONDS=str(args.work_seconds),
        TESTGEN_STEPS=str(args.steps),
    )
    if args.celery:
        os.environ.update(celery_environment(args))
    elif args.worker:  # the job API enqueues Django tasks (example_project/testgen/jobs_tasks.py)
        os.environ["TESTGEN_DISPATCH"] = "tasks"
    log = Log(args.quiet)
    registry = Registry(log)  # the second service, starting while this process sets up
    try:
        return run_demo(args, log, registry)
    finally:
        registry.close()


def run_demo(args: argparse.Namespace, log: Log, registry: Registry) -> int:
    setup_django()
    from django.conf import settings

    # Before any agent starts (they inherit the environment): their outbox messages name it.
    os.environ["TESTGEN_REGISTRY_URL"] = registry.wait_ready()

    run = args.run or next_run()
    driver: QueueDriver
    if args.celery:
        driver = CeleryDriver(args, run, log)
    elif args.worker:
        driver = WorkerDriver(args, log)
    else:
        driver = QueueDriver(args, log)
    print(f"{driver.banner()}, database {vendor()} ({settings.DATABASES['default']['NAME']})", flush=True)
    registry.start_relays(args.relays)
    jobs = request_jobs(run, args.jobs, log)
    counts = driver.run(jobs)
    errors = driver.errors + registry.drain(run, timeout=args.timeout)
    summary = summarize(run, [(job.tenant, job.key) for job in jobs], counts, registry.artifacts(run))
    if driver.deliveries_note:
        summary["deliveries_note"] = driver.deliveries_note
    summary["errors"] = errors
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    print_summary(summary)
    if args.json:
        print(json.dumps(summary), flush=True)
    return 0 if summary["ok"] and not errors else 1
