"""Celery system checks (W101-W104, E101), each under the configuration that triggers it.

The checks read the configuration of the app ``celery_app()`` finds (``TASKCLAIM_CELERY_APP``
here), so each test changes that app's ``conf`` for its duration and restores it after.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_taskclaim import checks as core_checks
from django_taskclaim.contrib.celery import checks

try:
    from django_taskclaim import celery as bridge
    from django_taskclaim.contrib.celery import options as registry
    from tests.programs.celery_app import app_conf
except ImportError:  # in CI a missing Celery is a failure, not a skip
    if os.environ.get("CI"):
        raise
    pytest.skip("celery is not installed", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("use_test_app")


@pytest.fixture
def use_test_app() -> Iterator[None]:
    with override_settings(TASKCLAIM_CELERY_APP="tests.programs.celery_app.app"):
        yield


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


@bridge.claimed_task(key="{0}", acks_late=True, reject_on_worker_lost=True)
def explicit_acks_late(name: str) -> None:
    """A claimed task that sets acks_late itself: exempt from W101/W103."""


def test_recommended_configuration_passes() -> None:
    assert checks.check_celery() == []


def test_a_default_lease_out_of_bounds_is_reported_by_e005_not_a_crash() -> None:
    with override_settings(TASKCLAIM_DEFAULT_LEASE=10**9):
        assert "django_taskclaim.E005" in ids(core_checks.check_settings())
        checks.check_celery()  # reads the leases of claimed tasks: must not raise


def test_w101_acks_late_off() -> None:
    with app_conf(task_acks_late=False):
        (warning,) = checks.check_celery()
    assert warning.id == "django_taskclaim.W101" and warning.hint
    assert "tests.programs.celery_app.work" in warning.msg
    assert "explicit_acks_late" not in warning.msg  # the task's own acks_late=True wins


def test_w102_prefetch_multiplier() -> None:
    with app_conf(worker_prefetch_multiplier=4):
        (warning,) = checks.check_celery()
    assert warning.id == "django_taskclaim.W102" and "4" in warning.msg and warning.hint


def test_w103_reject_on_worker_lost_off() -> None:
    with app_conf(task_reject_on_worker_lost=False):
        (warning,) = checks.check_celery()
    assert warning.id == "django_taskclaim.W103" and "tests.programs.celery_app.work" in warning.msg
    assert "explicit_acks_late" not in warning.msg


def test_w104_visibility_timeout_shorter_than_a_lease() -> None:
    # tests.programs.celery_tasks.always_fails has a 5 s lease; the others take the default lease.
    with override_settings(TASKCLAIM_DEFAULT_LEASE=1), app_conf(broker_transport_options={"visibility_timeout": 3}):
        (warning,) = checks.check_celery()
    assert warning.id == "django_taskclaim.W104"
    assert "always_fails" in warning.msg and "lease (5s)" in warning.msg and "(3s)" in warning.msg


def test_w104_visibility_timeout_shorter_than_a_time_limit() -> None:
    # The Redis default visibility timeout is one hour.
    with app_conf(task_time_limit=7200), app_conf(broker_transport_options={}):
        (warning,) = checks.check_celery()
    assert warning.id == "django_taskclaim.W104" and "time limit (7200s)" in warning.msg


def test_w104_only_for_brokers_with_a_visibility_timeout() -> None:
    with app_conf(broker_url="amqp://guest@127.0.0.1//", broker_transport_options={"visibility_timeout": 1}):
        assert checks.check_celery() == []


@pytest.mark.parametrize("path", ["tests.no_such_module.app", "tests.programs.celery_app.work"])
def test_e101_app_cannot_be_loaded(path: str) -> None:
    with override_settings(TASKCLAIM_CELERY_APP=path):
        (error,) = checks.check_celery()
    assert error.id == "django_taskclaim.E101" and path in error.msg and error.hint


def test_silent_when_the_bridge_is_not_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_registry", {})
    with override_settings(TASKCLAIM_CELERY_APP=None), app_conf(task_acks_late=False):
        assert checks.check_celery() == []


@pytest.mark.django_db  # Django 6.1+: `check` runs the model checks on every database (a query on SQLite)
def test_checks_are_registered() -> None:
    out, err = io.StringIO(), io.StringIO()
    with app_conf(task_acks_late=False, worker_prefetch_multiplier=8):
        call_command("check", stdout=out, stderr=err)
    text = out.getvalue() + err.getvalue()
    assert "django_taskclaim.W101" in text and "django_taskclaim.W102" in text
