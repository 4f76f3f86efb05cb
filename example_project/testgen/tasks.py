"""The agent as a Celery task (``--celery``): ``claimed_task`` claims, the body publishes fenced.

``claimed_task`` claims the job's key for every delivery of the message (a duplicate publish,
a Redis visibility-timeout redelivery, a redelivery after a killed worker), runs the body
under keepalive, and gives duplicates the stored result. The job API publishes the message
with ``enqueue_once`` (:func:`.views.request_job`). Imported only in Celery mode.
"""

from __future__ import annotations

import os
from typing import Any

from django_taskclaim.celery import claimed_task

from .agent import generate_and_publish
from .jobs import JobSpec, job_key


@claimed_task(
    key=job_key,  # the lease is TASKCLAIM_DEFAULT_LEASE
    tenant="{tenant}",
    on_busy="retry",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    name="testgen.generate_suite",
)
def generate_suite(self: Any, tenant: str, run: str, payload: dict[str, Any]) -> dict[str, Any]:
    agent = os.environ.get("TESTGEN_AGENT") or self.claim.owner  # the demo names its workers
    return generate_and_publish(self.claim, JobSpec.from_payload(tenant, run, payload), agent)
