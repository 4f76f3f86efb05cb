"""What a job is: "generate tests for this endpoint, in this run, for this tenant", and its key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django_taskclaim import TaskKey

OPERATION = "test-generation"


@dataclass(frozen=True)
class JobSpec:
    """One request: which tenant wants tests for which endpoint, in which run, from which spec."""

    tenant: str
    run: str
    service: str
    endpoint: str
    version: str = "v1"
    framework: str = "pytest"

    @property
    def task_key(self) -> TaskKey:
        # The identity is the *work*: run + service + endpoint + operation, at one spec version,
        # for one tenant. Never the prompt text, a message id or the agent's name: a redelivered
        # or re-requested job must map to the same key, and another run to another key.
        return TaskKey(
            OPERATION,
            run=self.run,
            scope=(self.service, self.endpoint),
            version=self.version,
            tenant=self.tenant,
        )

    @property
    def payload(self) -> dict[str, Any]:
        # Input that is not part of the identity; the same key with another framework is a
        # client error (PayloadMismatch), not a new job.
        return {
            "service": self.service,
            "endpoint": self.endpoint,
            "spec_version": self.version,
            "framework": self.framework,
        }

    @classmethod
    def from_payload(cls, tenant: str, run: str, payload: dict[str, Any]) -> JobSpec:
        return cls(
            tenant=tenant,
            run=run,
            service=payload["service"],
            endpoint=payload["endpoint"],
            version=payload["spec_version"],
            framework=payload["framework"],
        )


def job_key(tenant: str, run: str, payload: dict[str, Any]) -> TaskKey:
    """The identity of the job that a task's arguments ask for (the Celery and Django tasks')."""
    return JobSpec.from_payload(tenant, run, payload).task_key
