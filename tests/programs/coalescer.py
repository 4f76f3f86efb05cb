"""Racers for tests/processes/test_coalescing_processes.py: ``python -m tests.programs.coalescer storm DOC N``
(forked eight at a time by tests.programs.fleet).

Connects, says "ready", waits for "go" on stdin, then enqueues the coalesced ``reindex(DOC)`` N times in
a row with ``version=[pid, i]``, each in its own transaction, and says "done" with the result ids in
order. A racer's enqueues commit in the order it made them: the last to commit of all the storm's is
some racer's last (``i = N - 1``)."""

from __future__ import annotations

import argparse
import os
import sys

from devtools.events import emit


def storm(args: argparse.Namespace) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connections

    from django_taskclaim.conf import settings
    from tests.testapp import coalesced_tasks

    connections[settings.DATABASE].ensure_connection()
    emit(event="ready", pid=os.getpid())
    sys.stdin.readline()
    ids = [coalesced_tasks.reindex.enqueue(args.doc, version=[os.getpid(), i]).id for i in range(args.n)]
    emit(event="done", pid=os.getpid(), ids=ids)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("storm")
    p.add_argument("doc", type=int)
    p.add_argument("n", type=int)
    args = parser.parse_args()
    {"storm": storm}[args.mode](args)


if __name__ == "__main__":
    main()
