"""A handler module whose process is slow to tear down (``tests/processes/test_supervisor.py``): an
object whose finaliser takes 3 s in a supervisor's child, as tearing down a large heap does on
loaded cores, and an exit hook (``atexit``) that writes the file ``atexit.PID`` in
``TASKCLAIM_TEST_STARTED_DIR``, as a user's flush of its telemetry would."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

from tests.programs.worker_handlers import effect as effect

TEARDOWN = 3.0  # past the test's grace (1 s) and the supervisor's margin after it (1 s)


class _SlowToFinalise:
    def __del__(self) -> None:
        if multiprocessing.parent_process() is not None:  # a supervisor's child; the supervisor exits as usual
            time.sleep(TEARDOWN)  # the teardown's own length, not a wait for anything


_held = _SlowToFinalise()


@atexit.register
def _flush() -> None:
    (Path(os.environ["TASKCLAIM_TEST_STARTED_DIR"]) / f"atexit.{os.getpid()}").touch()


__all__: list[Any] = ["effect"]
