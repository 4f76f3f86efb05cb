"""A ``taskclaim_worker`` for a fleet (``python -m tests.programs.fleet N tests.programs.pool_worker ARGS…``):
says ``ready`` with its pid, waits for ``go`` on stdin, then runs ``manage.py taskclaim_worker ARGS``
and says ``done`` with its JSON report. Each copy is a process of its own, killed or paused alone."""

from __future__ import annotations

import io
import json
import os
import sys

from devtools.events import emit


def main() -> None:
    from django.core.management import call_command

    emit(event="ready", pid=os.getpid())
    if sys.stdin.readline().strip() != "go":
        return
    out = io.StringIO()
    call_command("taskclaim_worker", *sys.argv[1:], "--json", stdout=out)
    emit(event="done", pid=os.getpid(), **json.loads(out.getvalue()))


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    main()
