"""The demo: several agents, a queue that delivers every job more than once, one agent paused
past its lease and another killed mid-work — and every job takes effect exactly once.

    python3 -m example_project                      # SQLite under example_project/var/, no server
    DATABASE_URL=postgresql://u:p@host/db python3 -m example_project
    python3 -m example_project --celery --redis-url redis://127.0.0.1:6379/0
    python3 -m example_project --worker             # Django tasks, run by taskclaim_worker agents

The driver plays the message queue: it requests the jobs through the project's own
``POST /api/jobs`` view, delivers each job ``--copies`` times to agent processes (prefetch 1),
redelivers a message whose agent died or did not acknowledge it within the visibility
timeout, and re-sends a job an agent found busy (like a Celery retry). It prints what happens,
then checks the database: every job SUCCEEDED, exactly one published suite per job, each
referenced artifact on disk. Each suite is also published to a second service, the artifact
registry (its own server process and SQLite file), through the outbox: recorded with the job's
completion, delivered by ``taskclaim_relay`` processes; the summary checks that each arrived
there exactly once. It exits 1 if any job took effect twice or was lost, on either side.
"""

from __future__ import annotations

import argparse
import os


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be 1 or more")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < 3600:
        raise argparse.ArgumentTypeError(f"{value} must be between 0 and 3600 seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m example_project",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--jobs", type=positive_int, default=12, help="jobs to request (default: %(default)r)"
    )
    p.add_argument(
        "--agents",
        type=positive_int,
        default=4,
        help="agent processes, at least 2: one is paused, one killed (default: %(default)r)",
    )
    p.add_argument(
        "--copies",
        type=positive_int,
        default=2,
        help="deliveries of each job by the queue (default: %(default)r)",
    )
    p.add_argument(
        "--relays",
        type=positive_int,
        default=2,
        help="'manage.py taskclaim_relay' processes delivering the outbox's messages to the "
        "registry (default: %(default)r)",
    )
    p.add_argument(
        "--work-seconds",
        type=positive_seconds,
        default=1.2,
        help="simulated generation time per job (default: %(default)r)",
    )
    p.add_argument(
        "--steps",
        type=positive_int,
        default=4,
        help="tests per generated suite (default: %(default)r)",
    )
    p.add_argument(
        "--lease",
        type=positive_seconds,
        default=1.5,
        help="the agents' lease in seconds; heartbeats every lease/3 (default: %(default)r)",
    )
    p.add_argument(
        "--visibility",
        type=positive_seconds,
        default=None,
        help="seconds before an unacknowledged delivery is redelivered "
        "(default: 2 x lease + work seconds)",
    )
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=180.0,
        help="give up after this many seconds (default: %(default)r)",
    )
    p.add_argument(
        "--seed", type=int, default=42, help="delivery order seed (default: %(default)r)"
    )
    p.add_argument(
        "--run", default=None, help="run id in the job keys (default: the next free run-N)"
    )
    p.add_argument("--quiet", action="store_true", help="print only the chaos and the summary")
    p.add_argument("--json", action="store_true", help="end with the summary as one JSON line")
    p.add_argument(
        "--celery",
        action="store_true",
        help="run the agents as real Celery workers (needs Redis: --redis-url or REDIS_URL)",
    )
    p.add_argument(
        "--worker",
        action="store_true",
        help="enqueue the jobs through Django's Tasks framework and run the agents as "
        "'manage.py taskclaim_worker --queue testgen' workers: no message queue",
    )
    p.add_argument(
        "--concurrency",
        type=positive_int,
        default=4,
        help="jobs each --worker agent runs at once (taskclaim_worker --concurrency; "
        "default: %(default)r)",
    )
    p.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL", ""),
        help="Redis broker for --celery (default: $REDIS_URL)",
    )
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.agents < 2:
        parser.error("--agents must be at least 2: one agent is paused and another is killed")
    if args.celery and args.worker:
        parser.error("--celery and --worker are two ways to run the agents: choose one")
    if args.celery and not args.redis_url:
        parser.error("--celery needs a Redis URL: --redis-url redis://HOST:PORT/N or REDIS_URL")
    if args.visibility is None:
        args.visibility = 2 * args.lease + args.work_seconds
    return args

