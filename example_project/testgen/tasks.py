"""The agent as a Celery task, for ``--celery``: the same work as ``example_project.agent``.

``claimed_task`` claims the job's key for every delivery of the message (a duplicate publish,
a Redis visibility-timeout redelivery, a redelivery after a killed worker), runs the body
under keepalive, and gives duplicates the stored result. Imported only in Celery mode.
"""

from __future__ import annotations

import os
from typing import Any

from django_taskclaim import celery as bridge  # the Celery bridge: claimed_task, enqueue_once
from django_taskclaim.exceptions import StaleClaim

from .spec import JobSpec
from .work import discard, publish
from .work import generate_suite as write_suite

# Read when the worker imports this module; the demo passes its short settings this way.
LEASE = float(os.environ.get("TESTGEN_LEASE", "30"))
WORK_SECONDS = float(os.environ.get("TESTGEN_WORK_SECONDS", "1"))
STEPS = int(os.environ.get("TESTGEN_STEPS", "4"))


def job_key(tenant: str, run: str, payload: dict[str, Any]) -> Any:
    return JobSpec.from_payload(tenant, run, payload).task_key


@bridge.claimed_task(
    key=job_key,
    tenant="{tenant}",
    lease=LEASE,
    on_busy="retry",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    name="testgen.generate_suite",
)
def generate_suite(self: Any, tenant: str, run: str, payload: dict[str, Any]) -> dict[str, Any]:
    spec = JobSpec.from_payload(tenant, run, payload)
    claim = self.claim
    agent = os.environ.get("TESTGEN_AGENT") or claim.owner
    rel, tests = write_suite(claim, spec, agent, work_seconds=WORK_SECONDS, steps=STEPS)
    try:
        publish(claim, spec, agent, rel, tests)  # fenced: the suite row and the completion
    except StaleClaim:
        discard(rel)  # taken over while we worked: our draft is never published
        raise
    return {"tests": tests, "agent": agent, "token": claim.token}
