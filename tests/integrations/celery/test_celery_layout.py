"""The Celery checks in the standard project layout, without ``TASKCLAIM_CELERY_APP``.

Regression: with ``proj/celery.py`` calling ``app.autodiscover_tasks()`` and the claimed tasks
in ``shop/tasks.py``, ``manage.py check`` said nothing about acks_late off and prefetch 4:
no task module is imported before a worker starts, so the bridge looked unused. Each test
runs ``manage.py check`` in a process of its own, as a user does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytest.importorskip("celery")

LAYOUT = Path(__file__).resolve().parent / "celery_layout"


def check(settings_module: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CELERY_", "TASKCLAIM_"))}
    env["DJANGO_SETTINGS_MODULE"] = settings_module
    env["PYTHONPATH"] = str(ROOT)  # the app under test; the project comes from manage.py's folder
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=LAYOUT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("project", ["proj", "bare"])
def test_celery_warnings_fire_in_the_standard_layout(project: str) -> None:
    done = check(f"{project}.settings")
    assert done.returncode == 0, done.stderr  # warnings do not fail the check
    assert "django_taskclaim.W101" in done.stderr, done.stderr
    assert "shop.tasks.charge" in done.stderr  # the autodiscovered claimed task is named
    assert "django_taskclaim.W102" in done.stderr and "worker_prefetch_multiplier is 4" in done.stderr
    assert "django_taskclaim.W103" not in done.stderr  # reject_on_worker_lost is on
    assert "django_taskclaim.E101" not in done.stderr
