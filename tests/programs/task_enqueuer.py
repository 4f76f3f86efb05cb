"""Programs for tests/processes/test_django_tasks_processes.py: ``python -m tests.programs.task_enqueuer MODE …``.

Each prints one JSON line per event on stdout (``devtools.events``)."""

from __future__ import annotations

import argparse
import os
import sys

from devtools.events import emit


def enqueue(args: argparse.Namespace) -> None:
    """Connect, say ready, wait for 'go' on stdin, then enqueue the keyed charge once."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connection

    from tests.testapp import tasks

    connection.ensure_connection()
    emit(event="ready", pid=os.getpid())
    sys.stdin.readline()
    result = tasks.charge.enqueue(args.order, amount=args.amount)
    emit(event="enqueued", id=result.id, status=str(result.status))


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("enqueue")
    p.add_argument("order", type=int)
    p.add_argument("--amount", type=int, default=10)
    args = parser.parse_args()
    {"enqueue": enqueue}[args.mode](args)


if __name__ == "__main__":
    main()
