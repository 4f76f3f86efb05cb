"""The Celery bridge: Celery tasks whose body runs under a claim, and enqueue-once on commit.

The database is the source of truth; a broker message is only a signal to go and look.
A message delivered twice (visibility timeout, ``acks_late`` redelivery, a double click)
finds its task RUNNING or SUCCEEDED and never runs the body a second time.

    from django_taskclaim.celery import claimed_task, enqueue_once

    @claimed_task(key="invoice-{order_id}", lease=60, acks_late=True)
    def send_invoice(order_id): ...

    @claimed_task(key=lambda order_id: f"ship-{order_id}", app=app, bind=True)
    def ship(self, order_id):
        with self.claim.fenced():          # commits only while this worker owns the task
            Shipment.objects.create(order_id=order_id)

    enqueue_once(send_invoice, key="invoice-42", kwargs={"order_id": 42})

The code lives in ``django_taskclaim.contrib.celery``, one module per job; this module is
its public import path. See ``docs/celery.md`` for the recommended Celery settings and the
behaviour on each kind of duplicate.
"""

from __future__ import annotations

from .contrib.celery.app import celery_app, import_task_modules, project_app
from .contrib.celery.broker import (
    AMQP_SCHEMES,
    CONSUMER_TIMEOUT_DEFAULT,
    VISIBILITY_TIMEOUT_DEFAULTS,
    broker_scheme,
    consumer_timeout,
    queue_arguments,
    visibility_timeout,
)
from .contrib.celery.dispatch import REQUEUE_AFTER, Enqueued, Requeued, enqueue_once, requeue_lost
from .contrib.celery.options import ON_BUSY, ClaimOptions, KeySpec, claimed_tasks, in_use
from .contrib.celery.tasks import ClaimedTask, busy_countdown, claimed_task

__all__ = [
    "AMQP_SCHEMES", "CONSUMER_TIMEOUT_DEFAULT", "ON_BUSY", "REQUEUE_AFTER", "VISIBILITY_TIMEOUT_DEFAULTS",
    "ClaimOptions", "ClaimedTask", "Enqueued", "KeySpec", "Requeued", "broker_scheme", "busy_countdown",
    "celery_app", "claimed_task", "claimed_tasks", "consumer_timeout", "enqueue_once", "import_task_modules",
    "in_use", "project_app", "queue_arguments", "requeue_lost", "visibility_timeout",
]
