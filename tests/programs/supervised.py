"""A child for tests/repository/test_devtools.py: ``python -m tests.programs.supervised MODE``.

``ticker`` emits a numbered tick every 20 ms until killed; ``echo`` prints a stray log line and
then emits each stdin line back as an event until stdin closes; ``fail`` writes to stderr and
exits with code 3; ``pool`` starts a ``ticker`` in its own process group (as a Celery worker
forks its pool) and waits for it; ``probe`` says who it is (pid, argv, whether Django was set up
before it began) and then does what its stdin asks: exit with a code, raise, or leave a thread
running; ``reset`` changes its environment before it sets Django up.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import threading
import time

from devtools.events import emit


def main() -> None:
    mode = sys.argv[1]
    if mode == "ticker":
        n = 0
        while True:
            emit(event="tick", n=n)
            n += 1
            time.sleep(0.02)  # the child's pace, not synchronisation
    elif mode == "echo":
        print("a log line that is not an event", flush=True)
        emit(event="ready", at=dt.datetime(2026, 12, 3, tzinfo=dt.UTC))
        for line in sys.stdin:
            emit(event="echo", line=line.rstrip("\n"))
        emit(event="bye")
    elif mode == "fail":
        print("boom: the child's own error", file=sys.stderr, flush=True)
        sys.exit(3)
    elif mode == "pool":
        pool = subprocess.Popen([sys.executable, "-m", "tests.programs.supervised", "ticker"],
                                stdout=subprocess.DEVNULL)
        emit(event="pool", pid=pool.pid)
        pool.wait()
    elif mode in ("probe", "reset"):
        probe(mode)


def probe(mode: str) -> None:
    from django.apps import apps

    emit(event="started", pid=os.getpid(), argv=sys.argv, name=__name__, django_ready=apps.ready)
    if mode == "reset":
        import django

        os.environ["TASKCLAIM_PROBE"] = "changed"
        django.setup()
        emit(event="set up", pid=os.getpid())
        return
    what = sys.stdin.readline().strip()
    if what == "raise":
        raise ValueError("the child's own error")
    if what == "thread":  # the interpreter waits for it at exit
        threading.Thread(target=lambda: (time.sleep(0.2), emit(event="thread done"))).start()
        return
    sys.exit(int(what))


if __name__ == "__main__":
    main()
