"""An agent's part of a job: claim it by key, write the draft under keepalive, publish fenced.

    claim ──▶ keepalive (heartbeats) ──▶ fenced(): suite row + outbox message + complete ──▶ published once
                                          (a relay then POSTs the suite to the registry: it arrives once)
      ├ running elsewhere, or done: a duplicate, refused without doing the work
      └ taken over while it worked (StaleClaim): nothing written, the draft thrown away

:func:`run_job` is the whole protocol for a plain worker. The Django task (:mod:`.jobs_tasks`,
run by ``taskclaim_worker``), the Celery task (:mod:`.tasks`) and the LangGraph node
(:mod:`.graph`) get their claim and keepalive from the integration and call
:func:`generate_and_publish`: the same work, the same fenced publish.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings

from django_taskclaim.claims import Claim
from django_taskclaim.exceptions import StaleClaim
from django_taskclaim.models import Task

from .drafts import discard, write_draft
from .jobs import JobSpec
from .models import TestSuite

Report = Callable[..., None]  # report("claimed", token=3): what the agent does, for whoever watches


def ignore(event: str, **fields: Any) -> None:
    """The reporter when nobody watches."""


def run_job(spec: JobSpec, owner: str, *, delivery_id: str = "", report: Report = ignore) -> None:
    """Handle one delivery of a job: do the work if nobody else is doing or did it."""
    # The lease is TASKCLAIM_DEFAULT_LEASE; a claim on an expired lease takes the job over.
    outcome = Task.objects.claim(
        spec.task_key, owner=owner, payload=spec.payload, delivery_id=delivery_id
    )
    if outcome.claim is None:  # a duplicate: the job is running elsewhere, or done
        report("duplicate", task=outcome.task)
        return
    try:
        with outcome.claim.keepalive():  # a heartbeat every lease / 3 while the work runs
            generate_and_publish(outcome.claim, spec, owner, report)
    except StaleClaim as exc:  # another agent owns the job now: nothing of ours was written
        report("fenced", token=outcome.claim.token, action=exc.action)


def generate_and_publish(
    claim: Claim, spec: JobSpec, agent: str, report: Report = ignore
) -> dict[str, Any]:
    """Write the draft and publish it under ``claim``; a fenced-off draft is thrown away."""
    report("claimed", token=claim.token)
    rel = ""
    try:
        rel, tests = write_draft(claim, spec, agent, on_step=lambda step: report("progress", step=step))
        if claim.lost.is_set():  # keepalive gave the claim up: this work must not be published
            raise StaleClaim(claim.key, claim.tenant, claim.token, "keepalive")
        result = publish(claim, spec, agent, rel, tests)
    except StaleClaim:
        if rel:
            discard(rel)
        raise
    report("published", token=claim.token, artifact=rel, tests=tests)
    return result


def publish(claim: Claim, spec: JobSpec, agent: str, rel: str, tests: int) -> dict[str, Any]:
    """Record the suite, its message to the registry and the completion in one transaction, only
    if ``claim`` still owns the job.

    ``StaleClaim`` means a newer attempt took the job over: nothing was written, nothing will be
    sent. The message leaves after the commit: ``manage.py taskclaim_relay`` delivers it with the
    job's idempotency key and this claim's fencing token, which the registry checks.
    """
    result = {"tests": tests, "agent": agent, "token": claim.token}
    with claim.fenced():
        claim.outbox.http(
            "POST",
            f"{settings.TESTGEN_REGISTRY_URL}/artifacts/",
            json={
                "tenant": spec.tenant,
                "job_key": claim.key,
                "run": spec.run,
                "token": claim.token,
                "artifact": rel,
                "tests": tests,
            },
            effect="publish",
        )
        TestSuite.objects.create(
            tenant=spec.tenant,
            job_key=claim.key,
            run=spec.run,
            service=spec.service,
            endpoint=spec.endpoint,
            token=claim.token,
            agent=agent,
            artifact=rel,
            tests=tests,
        )
        claim.complete(result=result, result_ref=rel)
    return result
