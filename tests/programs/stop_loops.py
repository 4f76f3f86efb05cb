"""A loop stopped by SIGTERM/SIGINT, as the commands' and the worker's loops are:
``python -m tests.programs.stop_loops MODE`` (tests/processes/test_stop_signals.py).

It says ``ready``, waits for a line on stdin, says ``looping`` once its handlers are in, then spins
through its stop's ``wait(0)`` (where a signal handler that takes the stop's lock would find it
held, as the real loops do between two rounds) until a stop signal ends the loop; then it says
``stopped`` and exits 0. MODE: ``reclaim`` (the reclaim command's ``ReclaimLoop``, a round that
does nothing), ``worker`` (the worker's ``graceful_stop``), ``command`` (the relay's and the
scheduler's ``stop_on_signals``).
"""

from __future__ import annotations

import os
import sys

from devtools.events import emit


def main(mode: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django_taskclaim.management.commands.taskclaim_reclaim import ReclaimLoop
    from django_taskclaim.stopping import Stop, stop_on_signals
    from django_taskclaim.supervisor import graceful_stop

    emit(event="ready", pid=os.getpid())
    sys.stdin.readline()
    said: list[bool] = []

    def looping() -> None:  # the handlers are in place
        if not said:
            said.append(True)
            emit(event="looping")

    if mode == "reclaim":
        ReclaimLoop(looping, 0).run()
    else:
        stop = Stop()
        with graceful_stop(stop, 60) if mode == "worker" else stop_on_signals(stop):
            looping()
            while not stop.wait(0):
                pass
    emit(event="stopped", pid=os.getpid())


if __name__ == "__main__":
    main(sys.argv[1])
