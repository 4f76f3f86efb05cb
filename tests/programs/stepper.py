"""A task of five durable steps, run as an OS process that may SIGKILL itself:
``python -m tests.programs.stepper KEY DIE LEASE``.

It runs ``run_once(KEY, body, lease=LEASE, on_busy="wait")`` (waiting for a dead owner's lease to run
out, then taking the task over); ``body`` runs steps ``step-1``…``step-5`` with ``claim.step``, each
step's function recording one ``Effect`` row (``task_key`` ``KEY:step-N``, committed at once: the
call happened). ``DIE``:

- ``after-new-step``: SIGKILL itself right after the first step whose function it called returned
  (its result stored): run again and again, each process runs one step more;
- ``before-store-N``: SIGKILL itself inside step N's function, after its effect and before the step's
  result is stored (the window in which a step runs again);
- ``pause-before-store-N``: SIGSTOP itself at the same point (the test continues it once another
  process took the task over: its store of step N is then refused, and it answers as a duplicate);
- ``never``: run to the end.

It prints ``claimed`` (with its token) once the body runs, and ``done`` with the task's result.
"""

from __future__ import annotations

import os
import signal
import sys

from devtools.events import emit

STEPS = 5


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django_taskclaim import run_once
    from django_taskclaim.execution import current_claim
    from tests.testapp.models import Effect

    key, die, lease = sys.argv[1], sys.argv[2], float(sys.argv[3])
    die_in = int(die.removeprefix("before-store-")) if die.startswith("before-store-") else None
    pause_in = int(die.removeprefix("pause-before-store-")) if die.startswith("pause-before-store-") else None

    def call(n: int, token: int) -> str:
        Effect.objects.create(task_key=f"{key}:step-{n}", token=token, worker=str(os.getpid()))
        if n == die_in:
            os.kill(os.getpid(), signal.SIGKILL)  # the call happened; its result is not stored
        if n == pause_in:
            emit(event="paused", step=n)
            os.kill(os.getpid(), signal.SIGSTOP)  # its keepalive stops too: the lease runs out
        return f"result-{n}"

    ran: list[int] = []

    def run_step(n: int, token: int) -> str:
        ran.append(n)
        return call(n, token)

    def body() -> list[str]:
        claim = current_claim()
        emit(event="claimed", token=claim.token)
        results = []
        for n in range(1, STEPS + 1):
            before = len(ran)
            results.append(claim.step(f"step-{n}", run_step, n, claim.token))
            if len(ran) > before and die == "after-new-step":
                os.kill(os.getpid(), signal.SIGKILL)  # step n is stored; the process dies now
        return results

    emit(event="done", result=run_once(key, body, lease=lease, on_busy="wait"))


if __name__ == "__main__":
    main()
