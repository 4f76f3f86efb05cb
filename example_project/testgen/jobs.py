"""Requesting jobs: the demo's catalog, and ``request_job`` (once per key, on commit with Celery)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction

from django_taskclaim.models import Task

from .spec import OPERATION, JobSpec

# Endpoints the demo asks the agents to cover: (service, endpoint).
CATALOG: list[tuple[str, str]] = [
    ("payments", "POST /payments"),
    ("payments", "POST /payments/{id}/refund"),
    ("invoices", "GET /invoices/{id}"),
    ("invoices", "POST /invoices"),
    ("users", "PATCH /users/{id}"),
    ("users", "DELETE /users/{id}"),
    ("orders", "GET /orders"),
    ("orders", "POST /orders/{id}/cancel"),
]
TENANTS = ("acme", "globex")


def demo_jobs(run: str, count: int) -> list[JobSpec]:
    """``count`` jobs for the demo: the catalog for each tenant, then synthetic endpoints."""
    specs = [
        JobSpec(tenant, run, service, endpoint, "v3")
        for service, endpoint in CATALOG
        for tenant in TENANTS
    ]
    n = 0
    while len(specs) < count:
        n += 1
        specs.extend(
            JobSpec(tenant, run, "reports", f"GET /reports/{n}", "v3") for tenant in TENANTS
        )
    return specs[:count]


def request_job(spec: JobSpec) -> tuple[Task, bool]:
    """Create the job's task (PENDING) unless it exists; ``(task, created)``. Idempotent.

    With ``TESTGEN_DISPATCH = "celery"`` the Celery task is published once, on commit.
    """
    from django_taskclaim.claims import ensure_task

    if settings.TESTGEN_DISPATCH != "celery":
        return ensure_task(spec.task_key, payload=spec.payload)
    # Imported here so that the SQLite/PostgreSQL demo never imports Celery.
    from django_taskclaim.celery import enqueue_once

    from .tasks import generate_suite

    key = spec.task_key
    with transaction.atomic():
        existed = Task.objects.filter(tenant=key.tenant, key=key.key).exists()
        # Creates the row in this transaction and publishes on commit; a key that is already
        # pending, running or done is not published again.
        enqueue_once(
            generate_suite,
            key=key.key,
            tenant=key.tenant,
            args=(spec.tenant, spec.run, spec.payload),
        )
        task, _ = ensure_task(key, payload=spec.payload)  # stores the payload's fingerprint
    return task, not existed


def run_of(key: str) -> str:
    """The run part of a job key (keys are ``run:scope…:operation@version``)."""
    return key.split(":", 1)[0]


def jobs_state(run: str | None = None) -> list[dict[str, Any]]:
    """The jobs (optionally of one run) with their state, newest first, for the page and the API."""
    from django.db.models import Count, Q

    tasks = Task.objects.filter(key__contains=f":{OPERATION}")
    if run:
        tasks = tasks.filter(key__startswith=f"{run}:")
    tasks = tasks.annotate(
        claims=Count("attempt_set", filter=Q(attempt_set__token__isnull=False)),
        duplicates=Count("attempt_set", filter=Q(attempt_set__outcome="duplicate")),
    ).order_by("-id")[:500]
    return [
        {
            "tenant": t.tenant,
            "key": t.key,
            "status": t.status,
            "owner": t.owner,
            "token": t.fencing_token,
            "attempts": t.attempts,
            "claims": t.claims,
            "duplicates_refused": t.duplicates,
            "lease_expires_at": t.lease_expires_at.isoformat() if t.lease_expires_at else None,
            "result": t.result,
            "artifact": t.result_ref,
            "error": t.error,
            "updated_at": t.updated_at.isoformat(),
        }
        for t in tasks
    ]
