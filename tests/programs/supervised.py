"""A child for tests/repository/test_devtools.py: ``python -m tests.programs.supervised MODE``.

``ticker`` emits a numbered tick every 20 ms until killed; ``echo`` prints a stray log line and
then emits each stdin line back as an event until stdin closes; ``fail`` writes to stderr and
exits with code 3; ``pool`` starts a ``ticker`` in its own process group (as a Celery worker
forks its pool) and waits for it.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
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


if __name__ == "__main__":
    main()
