"""A Django task backend's checks (``ClaimBackend.check()``: E201, W201–W203) run in every
``manage.py check`` — on Django 6.x, where the framework registers its task check only once
``django.tasks`` is imported, and on 5.2 with the backport left out of ``INSTALLED_APPS`` — and
``taskclaim_worker`` refuses to start (exit 2, the check's message) with a backend it cannot use,
claiming nothing. The processes load ``tests/settings_backend_checks.py`` (a mistyped BACKOFF
field)."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_taskclaim.models import Task
from django_taskclaim.tasks.compat import FRAMEWORK
from tests.conftest import ROOT
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

BAD_OPTIONS = {"BACKOFF": {"bse": 2}}
BAD_TASKS = {"default": {"BACKEND": "django_taskclaim.tasks.ClaimBackend", "QUEUES": ["default", "emails"],
                         "OPTIONS": BAD_OPTIONS}}


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``manage.py ARGS`` in a fresh process (nothing imported beforehand), as a new project runs it."""
    env = dict(env, DJANGO_SETTINGS_MODULE="tests.settings_backend_checks")
    return subprocess.run([sys.executable, "-m", "django", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_manage_py_check_runs_the_backends_checks(worker_env: dict[str, str]) -> None:
    done = manage("check", env=worker_env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "django_taskclaim.E201" in done.stderr and "'bse'" in done.stderr, done.stderr
    if FRAMEWORK == "django_tasks":  # Django 5.2: the backport is not in INSTALLED_APPS
        assert "django_taskclaim.W203" in done.stderr, done.stderr
    assert done.stderr.count("django_taskclaim.E201") == 1, done.stderr  # once, not once per registration


def test_the_worker_refuses_a_backend_it_cannot_use_and_claims_nothing(worker_env: dict[str, str]) -> None:
    result = tasks.add.enqueue(1, 2)
    done = manage("taskclaim_worker", "--until-drained", env=worker_env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "django_taskclaim.E201" in done.stderr and "'bse'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    row = Task.objects.get(pk=int(result.id.rpartition(":")[2]))
    assert (row.status, row.attempts) == (Task.Status.PENDING, 0)


def test_the_worker_refuses_it_from_call_command_too() -> None:
    """``call_command`` skips the system checks: the worker asks the backend itself."""
    result = tasks.add.enqueue(1, 2)
    with override_settings(TASKS=BAD_TASKS), pytest.raises(CommandError) as info:
        call_command("taskclaim_worker", "--until-drained", stdout=io.StringIO())
    assert info.value.returncode == 2 and "E201" in str(info.value) and "'bse'" in str(info.value)
    assert Task.objects.get(pk=int(result.id.rpartition(":")[2])).attempts == 0


def test_a_warning_does_not_stop_the_worker() -> None:
    with override_settings(TASKCLAIM_AUDIT=False):  # W202: results lose their errors, nothing more
        out = io.StringIO()
        call_command("taskclaim_worker", "--until-drained", "--json", stdout=out)
    assert '"succeeded": 0' in out.getvalue()
