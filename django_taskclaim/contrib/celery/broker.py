"""What the broker does with an unacknowledged message: Redis/SQS visibility timeouts, RabbitMQ's
``consumer_timeout`` and queue arguments. Read by the system checks and the busy retry."""

from __future__ import annotations

from typing import Any

from celery import Celery

#: Brokers that hide an unacknowledged message for a while and then deliver it again, with
#: kombu's default visibility timeout in seconds.
VISIBILITY_TIMEOUT_DEFAULTS = {"redis": 3600.0, "rediss": 3600.0, "sentinel": 3600.0, "sqs": 1800.0}
#: Brokers speaking AMQP 0-9-1 (RabbitMQ), whose ``consumer_timeout`` closes the channel of a
#: delivery left unacknowledged for too long, and RabbitMQ's default for it in seconds.
AMQP_SCHEMES = ("amqp", "amqps", "pyamqp", "librabbitmq")
CONSUMER_TIMEOUT_DEFAULT = 1800.0


def broker_scheme(app: Celery) -> str:
    """The scheme of the app's (first) broker URL: ``redis``, ``amqp``, ``sqs``…"""
    url = app.conf.broker_url or ""
    if isinstance(url, list | tuple):
        url = url[0] if url else ""
    if not url:
        return "amqp"  # Celery's default broker
    return str(url).split("://", 1)[0].split("+", 1)[0].split(";", 1)[0].lower()


def visibility_timeout(app: Celery) -> float | None:
    """Seconds after which the broker delivers an unacknowledged message again, if it does."""
    scheme = broker_scheme(app)
    if scheme not in VISIBILITY_TIMEOUT_DEFAULTS:
        return None
    options = app.conf.broker_transport_options or {}
    return float(options.get("visibility_timeout", VISIBILITY_TIMEOUT_DEFAULTS[scheme]))


def queue_arguments(app: Celery, queue: str | None) -> dict[str, Any]:
    """The ``x-`` arguments the app declares ``queue`` with (its default queue when ``None``)."""
    name = queue or app.conf.task_default_queue
    # Built afresh from the configuration: app.amqp.queues is cached on first use.
    declared = app.amqp.Queues(app.conf.task_queues).get(name)
    if declared is None:
        return {}
    return {**(declared.queue_arguments or {}), **(declared.consumer_arguments or {})}


def consumer_timeout(app: Celery, queue: str | None = None) -> tuple[float, bool] | None:
    """RabbitMQ's ``consumer_timeout`` for ``queue`` in seconds, and whether the app sets it.

    ``None`` for brokers other than RabbitMQ. A queue or consumer argument
    ``x-consumer-timeout`` (milliseconds; RabbitMQ 3.12+) is read from ``task_queues``. The
    server-wide ``consumer_timeout`` of ``rabbitmq.conf`` cannot be read by a client: without
    the argument, RabbitMQ's default (30 minutes) is assumed, with ``False``.
    """
    if broker_scheme(app) not in AMQP_SCHEMES:
        return None
    value = queue_arguments(app, queue).get("x-consumer-timeout")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value) / 1000, True
    return CONSUMER_TIMEOUT_DEFAULT, False
