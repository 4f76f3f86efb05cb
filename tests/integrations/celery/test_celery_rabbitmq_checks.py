"""Celery system checks for RabbitMQ (W102 on amqp, W105, W106) and the consumer timeout the
bridge reads from ``task_queues``, each under the configuration that triggers it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from django_taskclaim.contrib.celery import checks

try:
    from kombu import Queue

    from django_taskclaim import celery as bridge
    from django_taskclaim.contrib.celery import options as registry
    from tests.programs.celery_app import app, app_conf, work
    from tests.programs.celery_tasks import always_fails
except ImportError as exc:  # in CI a missing Celery is a failure, not a skip
    if os.environ.get("CI"):
        raise
    pytest.skip(f"{exc.name} is not installed", allow_module_level=True)

AMQP = "amqp://guest@127.0.0.1:5672//"


@pytest.fixture(autouse=True)
def rabbitmq_app() -> Iterator[None]:
    with override_settings(TASKCLAIM_CELERY_APP="tests.programs.celery_app.app"), app_conf(broker_url=AMQP):
        yield


def quorum(limit: int | None = None, **extra: Any) -> list[Queue]:
    args: dict[str, Any] = {"x-queue-type": "quorum", **extra}
    if limit is not None:
        args["x-delivery-limit"] = limit
    return [Queue("celery", queue_arguments=args)]


def test_recommended_configuration_passes_on_rabbitmq() -> None:
    assert checks.check_celery() == []


def test_w102_prefetch_covers_amqp() -> None:
    with app_conf(worker_prefetch_multiplier=4):
        (warning,) = checks.check_celery()
    assert warning.id == "django_taskclaim.W102" and "RabbitMQ" in warning.hint


def test_w105_time_limit_beyond_rabbitmqs_default_consumer_timeout() -> None:
    with app_conf(task_time_limit=7200):
        (warning,) = checks.check_celery()
    assert warning.id == "django_taskclaim.W105" and warning.hint
    assert "(1800s, RabbitMQ's default" in warning.msg and "(7200s)" in warning.msg


def test_w105_reads_x_consumer_timeout_of_the_queue() -> None:
    queues = quorum(**{"x-consumer-timeout": 60_000})
    with app_conf(task_queues=queues, task_time_limit=120):
        (warning,) = checks.check_celery()
    assert warning.id == "django_taskclaim.W105" and "(60s, x-consumer-timeout)" in warning.msg
    with app_conf(task_queues=queues, task_time_limit=30):
        assert checks.check_celery() == []


def test_w105_not_for_early_acks_nor_other_brokers(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the tasks that take acks_late from the app (another test module defines one with
    # its own acks_late=True).
    monkeypatch.setattr(registry, "_registry", {label: spec for label, spec in registry._registry.items()
                                              if "acks_late" not in spec.celery_options})
    with app_conf(task_time_limit=7200, task_acks_late=False):
        assert "django_taskclaim.W105" not in [m.id for m in checks.check_celery()]
    with app_conf(task_time_limit=7200, broker_url="redis://127.0.0.1:1/0",
                  broker_transport_options={"visibility_timeout": 9000}):
        assert checks.check_celery() == []


def test_w106_delivery_limit_below_max_attempts() -> None:
    with app_conf(task_queues=quorum(limit=2)):
        (warning,) = checks.check_celery()
    assert warning.id == "django_taskclaim.W106" and warning.hint
    # work allows 5 attempts, always_fails 3, the others TASKCLAIM_MAX_ATTEMPTS (5)
    assert "x-delivery-limit 2" in warning.msg and "max_attempts 5" in warning.msg


def test_w106_follows_taskclaim_max_attempts() -> None:
    with override_settings(TASKCLAIM_MAX_ATTEMPTS=50), app_conf(task_queues=quorum(limit=10)):
        (warning,) = checks.check_celery()
    assert warning.id == "django_taskclaim.W106" and "max_attempts 50" in warning.msg
    assert "tests.programs.celery_app.work" not in warning.msg  # its own max_attempts=5 is within the limit
    with app_conf(task_queues=quorum(limit=10)):
        assert checks.check_celery() == []


def test_w106_only_for_quorum_queues_with_a_limit() -> None:
    with app_conf(task_queues=[Queue("celery", queue_arguments={"x-delivery-limit": 1})]):
        assert checks.check_celery() == []
    with app_conf(task_queues=quorum()):
        assert checks.check_celery() == []


def test_busy_countdown_stays_below_half_the_x_consumer_timeout() -> None:
    assert bridge.consumer_timeout(app) == (1800.0, False)
    assert bridge.busy_countdown(always_fails.taskclaim, app) == 2.5  # lease 5 s / 2
    with app_conf(task_queues=quorum(**{"x-consumer-timeout": 3000})):
        assert bridge.consumer_timeout(app) == (3.0, True)
        assert bridge.busy_countdown(always_fails.taskclaim, app) == 1.5
        assert bridge.busy_countdown(work.taskclaim, app) == 0.3  # its own busy_countdown is shorter
    with app_conf(broker_url="redis://127.0.0.1:1/0"):
        assert bridge.consumer_timeout(app) is None
