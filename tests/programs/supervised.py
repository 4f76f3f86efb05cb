"""A child for tests/repository/test_devtools.py: ``python -m tests.programs.supervised MODE``.

``ticker`` emits a numbered tick every 20 ms until killed; ``echo`` prints a stray log line and
then emits each stdin line back as an event until stdin closes.
"""

from __future__ import annotations

import datetime as dt
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


if __name__ == "__main__":
    main()
