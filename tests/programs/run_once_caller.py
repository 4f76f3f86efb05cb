"""A run_once caller as a separate OS process: ``python -m tests.programs.run_once_caller KEY KIND``.

It says ready, waits for "go" on stdin, then calls ``run_once`` on a function that records one
``Effect`` row (committed at once: the effect happened) and returns a value of kind ``KIND``.
It prints one JSON line with the outcome, says ready again, and calls again at each further
"go", until its stdin ends.
"""

from __future__ import annotations

import os
import sys

from devtools.events import emit

VALUES = {"ok": {"ok": True}, "set": {"tags": {1, 2}}, "nul": "a\x00b", "surrogate": "\ud800"}


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connection

    from django_taskclaim import run_once
    from tests.testapp.models import Effect

    key, kind, lease = sys.argv[1], sys.argv[2], float(sys.argv[3])

    def effect() -> object:
        Effect.objects.create(task_key=key, token=0, worker=str(os.getpid()))
        return VALUES[kind]

    connection.ensure_connection()
    emit(event="ready")
    # One call per "go" line, each followed by "ready" again, until stdin ends: a later wave of
    # callers reuses these processes instead of paying Django's start-up again.
    while sys.stdin.readline():
        try:
            run_once(key, effect, lease=lease)
            outcome = "returned"
        except Exception as exc:  # the outcome is what the test reads
            outcome = type(exc).__name__
        emit(event="done", outcome=outcome)
        emit(event="ready")


if __name__ == "__main__":
    main()
