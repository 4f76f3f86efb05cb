"""A test for the runner's own tests (tests/repository/test_runner.py) to run through ``python3 -m
tests``; not collected by the suite (no ``test_`` file name), only when named.

``TASKCLAIM_PROBE_FAIL_ON=DB``: it fails on that database. ``TASKCLAIM_PROBE_HOLD=FOLDER``: it
writes its pid to ``FOLDER/DB.pid``, then waits to be stopped (its runner stopped).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

DB = os.environ.get("TASKCLAIM_TEST_DB", "sqlite")


def test_probe() -> None:
    hold = os.environ.get("TASKCLAIM_PROBE_HOLD")
    if hold:
        Path(hold, f"{DB}.pid").write_text(str(os.getpid()))
        threading.Event().wait(300)  # the runner's test stops it long before
    assert os.environ.get("TASKCLAIM_PROBE_FAIL_ON") != DB, f"the probe fails on {DB}, as asked"
