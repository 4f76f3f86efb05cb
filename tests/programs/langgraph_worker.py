"""A LangGraph worker process for the tests: ``python -m tests.programs.langgraph_worker THREAD [options]``.

It says ``ready``, waits for a line on stdin, resumes the thread (``invoke(None)``) with the
graph of :mod:`tests.programs.langgraph_app` on the shared checkpointer and prints the final state.
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("thread")
    parser.add_argument("--lease", type=float, default=30)
    parser.add_argument("--version", default="v1")
    parser.add_argument("--block", action="store_true", help="hold inside the node until a stdin line")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connection

    from tests.programs.langgraph_app import build, checkpointer, emit

    connection.ensure_connection()
    worker = f"worker-{os.getpid()}"
    with checkpointer() as saver:
        graph = build(saver, version=args.version, lease=args.lease, worker=worker, block=args.block)
        emit(event="ready", pid=os.getpid())
        sys.stdin.readline()
        final = graph.invoke(None, {"configurable": {"thread_id": args.thread}})
        emit(event="final", state=final, worker=worker)


if __name__ == "__main__":
    main()
