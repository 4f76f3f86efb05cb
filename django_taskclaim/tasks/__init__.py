"""A backend for Django's Tasks framework (``django.tasks`` on Django 6, the ``django_tasks``
backport on Django 5.2) on the task table: one owner at a time, leases, fencing, recovery of
dead workers, retries with backoff, and exactly one task per declared identity.

    TASKS = {"default": {"BACKEND": "django_taskclaim.tasks.ClaimBackend", "QUEUES": ["default"]}}

    @task()
    @keyed(lambda order_id: TaskKey("charge", run=f"order-{order_id}", tenant="acme"))
    def charge(order_id):
        claim = current_claim()
        with claim.fenced():                      # the effect commits with the completion
            Payment.objects.create(order_id=order_id)
            claim.complete("charged")
        return "charged"

Run the tasks with ``manage.py taskclaim_worker --queue default``; enqueue many at once with
``enqueue_many(task, [(args, kwargs), ...])`` (one multi-row insert per 1,000). A task declared
``@coalesced(group)`` is one task per group while it waits, and one follow-up while it runs.
See docs/django-tasks.md.
"""

from __future__ import annotations

from ..execution import current_claim
from .backend import ClaimBackend, enqueue_many
from .coalescing import coalesced
from .identity import AFTER_FAILURE, REUSE, RUN_AGAIN, claim_options, keyed

__all__ = [
    "AFTER_FAILURE", "REUSE", "RUN_AGAIN", "ClaimBackend", "claim_options", "coalesced", "current_claim",
    "enqueue_many", "keyed",
]
