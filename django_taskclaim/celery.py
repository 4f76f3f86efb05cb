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

See ``docs/celery.md`` for the recommended Celery settings and the behaviour on each kind
of duplicate.
"""

from __future__ import annotations

from .contrib.celery import (
    AMQP_SCHEMES,
    ON_BUSY,
    REQUEUE_AFTER,
    ClaimedTask,
    ClaimOptions,
    Enqueued,
    Requeued,
    broker_scheme,
    busy_countdown,
    celery_app,
    claimed_task,
    claimed_tasks,
    consumer_timeout,
    enqueue_once,
    import_task_modules,
    in_use,
    project_app,
    queue_arguments,
    requeue_lost,
    visibility_timeout,
)

__all__ = [
    "AMQP_SCHEMES", "ON_BUSY", "REQUEUE_AFTER", "ClaimOptions", "ClaimedTask", "Enqueued", "Requeued",
    "broker_scheme", "busy_countdown", "celery_app", "claimed_task", "claimed_tasks", "consumer_timeout",
    "enqueue_once", "import_task_modules", "in_use", "project_app", "queue_arguments", "requeue_lost",
    "visibility_timeout",
]
