"""The Celery bridge, by job: finding the app (``app``), the broker's redelivery rules
(``broker``), a claimed task's identity and the registry of claimed tasks (``options``), the
task base class and ``@claimed_task`` (``tasks``), and sending work (``dispatch``).
``django_taskclaim.celery`` is the documented import path of its public names."""

from .app import celery_app, import_task_modules, project_app
from .broker import AMQP_SCHEMES, broker_scheme, consumer_timeout, queue_arguments, visibility_timeout
from .dispatch import REQUEUE_AFTER, Enqueued, Requeued, enqueue_once, requeue_lost
from .options import ON_BUSY, ClaimOptions, claimed_tasks, in_use
from .tasks import ClaimedTask, busy_countdown, claimed_task

__all__ = [
    "AMQP_SCHEMES", "ON_BUSY", "REQUEUE_AFTER", "ClaimOptions", "ClaimedTask", "Enqueued", "Requeued",
    "broker_scheme", "busy_countdown", "celery_app", "claimed_task", "claimed_tasks", "consumer_timeout",
    "enqueue_once", "import_task_modules", "in_use", "project_app", "queue_arguments", "requeue_lost",
    "visibility_timeout",
]
