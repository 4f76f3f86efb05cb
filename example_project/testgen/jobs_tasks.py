"""The agent as a Django task (``--worker``): the job API enqueues it, ``taskclaim_worker`` runs it.

    TASKS = {"default": {"BACKEND": "django_taskclaim.tasks.ClaimBackend", "QUEUES": ["testgen"]}}
    python -m example_project.manage taskclaim_worker --queue testgen

``@keyed`` names the work by the job's ``TaskKey``: requested twice, the job is enqueued once (the
same result, the same id); requested with other input, ``PayloadMismatch``. The worker claims the
task from the task table, keeps its lease alive and, once a worker stopped, lets another take it
over; the body publishes the suite and completes the claim in one ``fenced()`` transaction, so a
worker that was taken over writes nothing. Imported only in that mode.
"""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal

from django_taskclaim.exceptions import StaleClaim
from django_taskclaim.tasks import RUN_AGAIN, current_claim, keyed

from .agent import generate_and_publish
from .jobs import JobSpec, job_key

try:
    from django.tasks import task  # Django 6
    from django.tasks.signals import task_enqueued  # the job API watches it (views.enqueue_task)
except ImportError:  # Django 5.2: the backport (django-tasks, "django_tasks" in INSTALLED_APPS)
    from django_tasks import task
    from django_tasks.signals import task_enqueued

__all__ = ["generate_suite", "job_event", "report", "task_enqueued"]

#: What the agent does (``event``: claimed, progress, published, fenced; with its fields), for
#: whoever watches: a task has no caller to report to. The demo's workers connect to it.
job_event = Signal()


def report(event: str, **fields: Any) -> None:
    job_event.send(JobSpec, event=event, **fields)


@task(queue_name="testgen")
@keyed(job_key, after_failure=RUN_AGAIN)  # a job requested again after it failed runs again
def generate_suite(tenant: str, run: str, payload: dict[str, Any]) -> dict[str, Any]:
    claim = current_claim()  # the worker's: one owner at a time, its lease kept alive meanwhile
    try:
        return generate_and_publish(claim, JobSpec.from_payload(tenant, run, payload), claim.owner, report)
    except StaleClaim as exc:  # taken over while it worked: nothing of ours was written
        report("fenced", token=claim.token, action=exc.action)
        raise
