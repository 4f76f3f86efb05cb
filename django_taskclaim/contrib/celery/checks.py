"""The Celery bridge's system checks: the settings that turn redeliveries into lost work or
needless duplicates (E101, W101–W106), registered through ``contrib.INTEGRATIONS``.

They run only when the bridge is in use: some ``claimed_task`` is defined (after importing the
modules the project's worker would import), or ``TASKCLAIM_CELERY_APP`` is set. They read the
configuration of the app that ``celery_app()`` returns (``TASKCLAIM_CELERY_APP``, else the
project's app as ``celery -A proj`` finds it), as the worker would see it, after importing the
modules a worker imports (the app's ``imports``/``include`` and each installed Django app's
``tasks`` module). This module imports Celery only when the check runs: without Celery
installed the bridge cannot be in use, and the check answers nothing.
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ...checkspec import spec
from ...conf import settings

E101 = spec("django_taskclaim.E101", "The Celery app cannot be loaded: {problem}",
            "Set TASKCLAIM_CELERY_APP to the dotted path of your Celery app, e.g. 'proj.celery.app'.")
W101 = spec("django_taskclaim.W101", "Celery acks_late is off for claimed task(s): {tasks}.",
            "Set CELERY_TASK_ACKS_LATE = True (or acks_late=True on the task): with early acks a "
            "message is acknowledged before the body runs, and a worker that dies mid-task loses it "
            "(only 'taskclaim_reclaim --requeue' brings it back).")
W102 = spec("django_taskclaim.W102", "Celery worker_prefetch_multiplier is {value}.",
            "Set CELERY_WORKER_PREFETCH_MULTIPLIER = 1: prefetched messages wait unacknowledged behind "
            "a busy worker slot, where a Redis/SQS visibility timeout delivers them a second time, where "
            "RabbitMQ's consumer_timeout runs for them too (closing the worker's channel), and a crash of "
            "that worker delays all of them.")
W103 = spec("django_taskclaim.W103", "Celery reject_on_worker_lost is off for claimed task(s): {tasks}.",
            "Set CELERY_TASK_REJECT_ON_WORKER_LOST = True: with acks_late, a message whose worker "
            "process was killed is then requeued instead of acknowledged as failed; the claim makes the "
            "redelivery harmless.")
W104 = spec("django_taskclaim.W104", "The broker's visibility_timeout ({timeout:g}s) is not longer than "
            "{what} ({longest:g}s) of claimed task {task}.",
            "Raise CELERY_BROKER_TRANSPORT_OPTIONS['visibility_timeout'] above the longest time limit "
            "(set time_limit on long tasks): an unacknowledged message older than the timeout is "
            "delivered again while the first delivery still runs.")
W105 = spec("django_taskclaim.W105", "RabbitMQ's consumer_timeout ({timeout:g}s{source}) is not longer than "
            "the time limit ({longest:g}s) of claimed task {task}, which acknowledges late.",
            "Raise consumer_timeout above the longest time limit: in rabbitmq.conf (consumer_timeout, "
            "in ms; a client cannot read it) or per queue with the 'x-consumer-timeout' argument in "
            "CELERY_TASK_QUEUES (RabbitMQ 3.12+). A delivery unacknowledged for longer makes RabbitMQ "
            "close the worker's channel (Celery's worker then stops) and deliver the message again; "
            "the claim keeps the body from running twice, but the worker is lost.")
W106 = spec("django_taskclaim.W106", "Quorum queue {queue!r} has x-delivery-limit {limit} but claimed task "
            "{task} allows max_attempts {attempts}.",
            "Set x-delivery-limit to at least max_attempts, or lower max_attempts: whichever is lower "
            "ends a message that keeps killing its worker. When RabbitMQ's limit comes first it drops "
            "(or dead-letters) the message while the task stays unfinished in the database, until "
            "'taskclaim_reclaim --requeue' sends it again; when max_attempts comes first the task ends FAILED "
            "and every later delivery raises TaskFailed. (A busy retry publishes a new message, so "
            "RabbitMQ counts only the returns that found the task free.)")


def check_celery(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The Celery settings that turn redeliveries into lost work or needless duplicates."""
    try:
        from . import app as apps
        from . import broker, options
    except ImportError:  # Celery is not installed: the bridge cannot be in use
        return []
    if not options.in_use():
        return []
    try:
        app = apps.celery_app()
        apps.import_task_modules(app)
        conf = app.conf
        defaults = {name: conf[name] for name in ("task_acks_late", "task_reject_on_worker_lost",
                                                  "task_time_limit", "task_soft_time_limit")}
        prefetch = conf.worker_prefetch_multiplier
        timeout = broker.visibility_timeout(app)
        tasks = options.claimed_tasks()
        rabbitmq = _rabbitmq_messages(app, tasks, defaults) if broker.broker_scheme(app) in broker.AMQP_SCHEMES else []
    except (ImproperlyConfigured, ImportError) as exc:
        return [E101.error(problem=f"{type(exc).__name__}: {exc}")]

    def effective(option: str, setting: str) -> list[str]:
        """Labels of claimed tasks (or 'the app default') where ``option`` is off."""
        if not tasks:
            return [] if defaults[setting] else ["(app default)"]
        return [t.label for t in tasks if not t.celery_options.get(option, defaults[setting])]

    messages: list[checks.CheckMessage] = []
    if off := effective("acks_late", "task_acks_late"):
        messages.append(W101.warning(tasks=", ".join(off)))
    if isinstance(prefetch, int) and prefetch > 1:
        messages.append(W102.warning(value=prefetch))
    if off := effective("reject_on_worker_lost", "task_reject_on_worker_lost"):
        messages.append(W103.warning(tasks=", ".join(off)))
    if timeout is not None and (worst := _longest_over(tasks, defaults, timeout)) is not None:
        messages.append(W104.warning(timeout=timeout, longest=worst[0], what=worst[1], task=worst[2]))
    return messages + rabbitmq


_TIME_LIMITS = (("time_limit", "task_time_limit"), ("soft_time_limit", "task_soft_time_limit"))


def _longest_over(tasks: list[Any], defaults: dict[str, Any], timeout: float) -> tuple[float, str, str] | None:
    """W104: the claimed task whose lease or time limit is the longest at or above ``timeout``."""
    worst: tuple[float, str, str] | None = None
    for task in tasks:
        candidates = [(task.lease_seconds, "the lease")]
        for option, setting in _TIME_LIMITS:
            limit = task.celery_options.get(option, defaults[setting])
            if limit:
                candidates.append((float(limit), f"the {option.replace('_', ' ')}"))
        longest, what = max(candidates)
        if longest >= timeout and (worst is None or longest > worst[0]):
            worst = (longest, what, task.label)
    return worst


def _rabbitmq_messages(app: Any, tasks: list[Any], defaults: dict[str, Any]) -> list[checks.CheckMessage]:
    """W105/W106: RabbitMQ's consumer timeout and quorum delivery limit against the claimed tasks."""
    from .broker import consumer_timeout, queue_arguments

    messages: list[checks.CheckMessage] = []
    worst: tuple[float, str, float, bool] | None = None  # (limit, task, timeout, timeout set by the app)
    short: tuple[str, int, str, int] | None = None  # (queue, limit, task, max_attempts)
    for task in tasks:
        queue = task.celery_options.get("queue")
        if task.celery_options.get("acks_late", defaults["task_acks_late"]):
            timeout, known = consumer_timeout(app, queue)  # type: ignore[misc]  # AMQP: never None
            limits = [task.celery_options.get(option, defaults[setting]) for option, setting in _TIME_LIMITS]
            longest = max((float(v) for v in limits if v), default=0.0)
            if longest and longest >= timeout and (worst is None or longest > worst[0]):
                worst = (longest, task.label, timeout, known)
        args = queue_arguments(app, queue)
        limit = args.get("x-delivery-limit")
        if args.get("x-queue-type") == "quorum" and isinstance(limit, int) and not isinstance(limit, bool):
            attempts = task.max_attempts or settings.MAX_ATTEMPTS
            if limit < attempts and (short is None or attempts - limit > short[3] - short[1]):
                short = (queue or app.conf.task_default_queue, limit, task.label, attempts)
    if worst is not None:
        source = ", x-consumer-timeout" if worst[3] else ", RabbitMQ's default: the server's setting cannot be read"
        messages.append(W105.warning(timeout=worst[2], source=source, longest=worst[0], task=worst[1]))
    if short is not None:
        messages.append(W106.warning(queue=short[0], limit=short[1], task=short[2], attempts=short[3]))
    return messages
