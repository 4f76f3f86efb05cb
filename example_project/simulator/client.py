"""The client's side of the demo: the jobs it asks for, requested through ``POST /api/jobs``."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from ..testgen.jobs import JobSpec
from .report import Log, short

# Endpoints the demo asks the agents to cover: (service, endpoint), for each tenant.
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


class Job(NamedTuple):
    """A requested job, as the queue carries it to the agents."""

    tenant: str
    run: str
    key: str
    payload: dict[str, Any]


def demo_jobs(run: str, count: int) -> list[JobSpec]:
    """``count`` jobs: the catalog for each tenant, then synthetic endpoints."""
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


def next_run() -> str:
    """The first ``run-N`` that no job or suite in the database uses yet."""
    from django_taskclaim.models import Task

    from ..testgen.models import TestSuite

    n = 1
    while (
        Task.objects.filter(key__startswith=f"run-{n}:").exists()
        or TestSuite.objects.filter(run=f"run-{n}").exists()
    ):
        n += 1
    return f"run-{n}"


def request_jobs(run: str, count: int, log: Log) -> list[Job]:
    """Request every job through ``POST /api/jobs``; the first one twice (a double click)."""
    from django.test import Client

    client = Client()
    jobs = []
    for i, spec in enumerate(demo_jobs(run, count)):
        body = {
            "tenant": spec.tenant,
            "run": spec.run,
            "service": spec.service,
            "endpoint": spec.endpoint,
            "version": spec.version,
        }
        for click in range(2 if i == 0 else 1):
            response = client.post(
                "/api/jobs", data=json.dumps(body), content_type="application/json"
            )
            data = response.json()
            if response.status_code not in (200, 201):
                raise SystemExit(f"POST /api/jobs failed with {response.status_code}: {data}")
            if click:
                log(
                    "client",
                    "requested",
                    f"{short(data['tenant'], data['key'])} again (a double click): "
                    f"HTTP {response.status_code}, created={data['created']}, the same job",
                )
        jobs.append(Job(data["tenant"], run, data["key"], spec.payload))
    log(
        "client",
        "requested",
        f"{len(jobs)} jobs through POST /api/jobs, e.g. {short(jobs[0].tenant, jobs[0].key)}",
        always=True,
    )
    return jobs
