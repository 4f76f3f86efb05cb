"""Fault-injection run: ``python -m tests.chaos --duration S --workers W --seed N --db D``.

Starts its own database server, W workers and a nemesis; after ``--duration`` seconds of
faults it stops injecting, sweeps expired leases until every task is finished (the quiet
period), then checks the outcome and prints a table. Exit status 0 when every property held,
1 on any violation, 2 on a harness error. See docs/fault-injection.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any


def positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, not {text}")
        return value

    return parse


def probability_spec(text: str) -> str:
    from tests.chaos.worker import parse_crash

    try:
        for value in parse_crash(text).values():
            if not 0 <= value <= 1:
                raise argparse.ArgumentTypeError(f"probability out of [0, 1] in {text!r}")
    except SystemExit as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def non_negative(text: str) -> float:
    value = number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {text}")
    return value


def fraction(text: str) -> float:
    value = number(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be within [0, 1], not {text}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=positive(float), default=60.0,
                   help="seconds of fault injection (default: %(default)s)")
    p.add_argument("--workers", type=positive(int), default=6,
                   help="worker processes (default: %(default)s)")
    p.add_argument("--concurrency", type=positive(int), default=1,
                   help="tasks each worker process has in hand at once, each on a thread "
                        "(default: %(default)s)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the nemesis (default: random, printed)")
    p.add_argument("--db", choices=("sqlite", "postgresql", "mariadb"), default="postgresql",
                   help="database (default: %(default)s)")
    p.add_argument("--lease", type=positive(float), default=2.0,
                   help="lease in seconds (default: %(default)s)")
    p.add_argument("--tasks", type=positive(int), default=None,
                   help="stop enqueueing after this many tasks (default: a backlog of 4 per worker "
                        "for the whole run)")
    p.add_argument("--steps", type=positive(int), default=3,
                   help="fenced writes per execution, the last one completes "
                        "(default: %(default)s)")
    p.add_argument("--work-ms", type=positive(float), default=100.0,
                   help="mean simulated work before each step (default: %(default)s)")
    p.add_argument("--fault-interval", type=positive(float), default=1.0,
                   help="mean seconds between faults (default: %(default)s)")
    p.add_argument("--crash", type=probability_spec,
                   default="after_claim=0.01,before_commit=0.01,after_commit=0.01",
                   help="crash points and their probabilities (default: %(default)s)")
    p.add_argument("--give-up", type=fraction, default=0.03,
                   help="share of executions that fail (to be retried) or release the task instead "
                        "of completing it (default: %(default)s)")
    p.add_argument("--skew", type=fraction, default=0.25,
                   help="share of workers started with the clock +1 h, PostgreSQL only "
                        "(default: %(default)s)")
    p.add_argument("--quiet", type=positive(float), default=None,
                   help="longest quiet period in seconds (default: max(60, 20 x lease))")
    p.add_argument("--faults", type=lambda text: tuple(filter(None, text.split(","))), default=None,
                   help="comma-separated fault kinds to inject (default: all that apply: "
                        "pause, kill, terminate, terminate_in_commit, timeout, restart; "
                        "failover only when named)")
    p.add_argument("--failover-interval", type=positive(float), default=20.0,
                   help="mean seconds from the end of one failover to the next kill of the primary, "
                        "with --faults failover (default: %(default)s)")
    p.add_argument("--replication", choices=("sync", "async"), default="sync",
                   help="the standby of --faults failover: synchronous (no acknowledged commit lost) "
                        "or asynchronous, to measure what it loses (default: %(default)s)")
    p.add_argument("--standby-lag", type=non_negative, default=0.0,
                   help="seconds by which the standby of --faults failover receives the WAL late "
                        "(a relay holds the replication stream; default: %(default)s)")
    p.add_argument("--ha", choices=("pg_ctl", "patroni"), default="pg_ctl",
                   help="who fails the primary over with --faults failover: the harness itself "
                        "(pg_ctl promote of its one standby) or Patroni with etcd, three members, "
                        "deciding each failover after the leader fails (--ha-failures); "
                        "--replication sync is Patroni's synchronous_mode (default: %(default)s)")
    p.add_argument("--ha-failures", type=lambda text: tuple(filter(None, text.split(","))),
                   default=("kill", "stop", "cut"),
                   help="with --ha patroni, how the leader fails at each failover, one drawn per failover "
                        "from this comma-separated list: kill (its machine SIGKILLed), stop (hung: "
                        "SIGSTOP), cut (its agent's network to etcd cut; its own agent demotes it) "
                        "(default: kill,stop,cut)")
    p.add_argument("--unsafe", action="store_true",
                   help="workers write the effect outside fenced(): the checker must fail")
    p.add_argument("--downstream", action="store_true",
                   help="workers also call a downstream service (a real HTTP server of its own, "
                        "fenced_endpoint) directly with claim.headers(), and record an outbox "
                        "message with each completion that taskclaim_relay processes deliver; "
                        "the checker counts the effects downstream")
    p.add_argument("--relays", type=positive(int), default=2,
                   help="taskclaim_relay processes of --downstream (default: %(default)s)")
    p.add_argument("--limits", action="store_true",
                   help="every other task under one of --limit-keys concurrency keys with a limit of "
                        "--limit; workers write a fenced start effect after each claim, and the checker "
                        "counts the executions of each key at once (tests/chaos/limits.py)")
    p.add_argument("--limit-keys", type=positive(int), default=3,
                   help="concurrency keys of --limits (default: %(default)s)")
    p.add_argument("--limit", type=positive(int), default=2,
                   help="the concurrency limit of each key of --limits (default: %(default)s)")
    p.add_argument("--schedules", action="store_true",
                   help="--schedulers taskclaim_scheduler processes fire a 1-second schedule whose "
                        "ticks the workers run; the nemesis pauses and kills them too, and the checker "
                        "wants every tick exactly once (tests/chaos/ticks.py)")
    p.add_argument("--schedulers", type=positive(int), default=3,
                   help="taskclaim_scheduler processes of --schedules (default: %(default)s)")
    p.add_argument("--celery", action="store_true",
                   help="run Celery workers through django_taskclaim.celery instead "
                        "(needs redis-server, or rabbitmq-server with --broker rabbitmq)")
    p.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis",
                   help="broker of the Celery variant (default: %(default)s)")
    p.add_argument("--keep", action="store_true",
                   help="keep the run folder (worker logs) after a pass")
    p.add_argument("--report", default=None,
                   help="also write the faults, figures and violations to this JSON file")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "big")
    from tests.chaos.run import run

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    # SIGTERM tears down like Ctrl-C: workers killed, the server stopped.
    signal.signal(signal.SIGTERM, interrupted)
    started = time.monotonic()
    code = run(args)
    print(f"seed {args.seed}, {time.monotonic() - started:.0f} s in all", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
