"""A worker that records every signal it sends: ``python -m tests.programs.signal_recorder worker``.

Each worker connects receivers that append one JSON line per signal to a file of its own, then
competes with the others for the same keys (tests/processes/test_signals_across_processes.py).
``describe`` and ``connect_recorder`` are also what the in-process signal tests record with.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from devtools.events import emit

SIGNAL_NAMES = ("task_claimed", "task_taken_over", "heartbeat_lost", "task_completed",
                "task_failed", "task_released", "stale_write_refused", "duplicate_delivery",
                "tasks_reclaimed")


def describe(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A JSON-able record of one signal."""
    record: dict[str, Any] = {"signal": name, "pid": os.getpid()}
    claim = kwargs.get("claim")
    if claim is not None:
        record.update(key=claim.key, tenant=claim.tenant, token=claim.token, owner=claim.owner)
    task = kwargs.get("task")
    if task is not None:
        record.update(key=task.key, tenant=task.tenant, owner=kwargs["owner"],
                      delivery_id=kwargs["delivery_id"])
    for field in ("key", "tenant", "token", "owner", "action", "takeover", "retry",
                  "previous_owner", "previous_token", "tasks"):
        if field in kwargs and field not in record:
            value = kwargs[field]
            record[field] = [list(row) for row in value] if field == "tasks" else value
    return record


def connect_recorder(sink: Any) -> list[Any]:
    """Connect a receiver to every signal that passes ``describe(...)`` records to ``sink``."""
    from django_taskclaim import signals

    receivers = []
    for name in SIGNAL_NAMES:
        def receiver(sender: Any, _name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            sink(describe(_name, kwargs))

        getattr(signals, name).connect(receiver, weak=False, dispatch_uid=f"test-recorder-{name}")
        receivers.append(receiver)
    return receivers


def disconnect_recorder() -> None:
    from django_taskclaim import signals

    for name in SIGNAL_NAMES:
        getattr(signals, name).disconnect(dispatch_uid=f"test-recorder-{name}")


def worker(args: argparse.Namespace) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connection

    from django_taskclaim.exceptions import StaleClaim
    from django_taskclaim.models import Task

    log = open(f"{args.log}.{os.getpid()}.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    def sink(record: dict[str, Any]) -> None:
        log.write(json.dumps(record) + "\n")
        log.flush()

    connect_recorder(sink)
    me = f"sig-{os.getpid()}"
    keys = [f"sig-{i}" for i in range(args.keys)]
    connection.ensure_connection()
    emit(event="ready")
    sys.stdin.readline()
    done: set[str] = set()
    deliveries = 0
    deadline = time.monotonic() + 60
    while len(done) < len(keys) and time.monotonic() < deadline:
        for key in keys:
            if key in done:
                continue
            deliveries += 1
            outcome = Task.objects.claim(key, owner=me, lease=args.lease,
                                         delivery_id=f"{me}-{deliveries}")
            if not outcome.claimed:
                if outcome.task.is_terminal:
                    done.add(key)
                continue
            claim = outcome.claim
            assert claim is not None
            n = int(key.rsplit("-", 1)[1])
            if claim.token == 1 and n % 3 == 0:
                # The first owner stalls past its lease until another worker has taken over
                # (the token moved on), so this one's completion is refused (a fenced-off write).
                until = time.monotonic() + 30
                while Task.objects.filter(pk=claim.task_id, fencing_token=claim.token).exists():
                    assert time.monotonic() < until, f"nobody took {key} over"
                    time.sleep(0.02)  # a poll of the task row, with the deadline above
            elif claim.token == 1 and n % 3 == 1:
                claim.fail("first attempt fails", retry=True)
                continue
            try:
                claim.complete({"by": me})
                done.add(key)
            except StaleClaim:
                pass
        time.sleep(0.02)  # idle poll between rounds
    log.close()
    emit(event="exit", done=len(done))


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("worker")
    p.add_argument("--keys", type=int, default=6)
    p.add_argument("--lease", type=float, default=0.4)
    p.add_argument("--log", required=True)
    worker(parser.parse_args())


if __name__ == "__main__":
    main()
