"""Django tasks that declare their own claim options (``claim_options``) and report what their
claim got: tests/integrations/django_tasks/test_django_tasks_options.py checks each option is honoured."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from django_taskclaim.tasks import claim_options, current_claim

try:
    from django.tasks import task  # type: ignore[attr-defined,unused-ignore]
except ImportError:
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]


def _lease_held() -> dict[str, Any]:
    """The running claim's lease, by the claim and by the task row (seconds left in the database)."""
    from django_taskclaim.models import Task

    claim = current_claim()
    expires = Task.objects.using(claim.using).values_list("lease_expires_at", flat=True).get(pk=claim.task_id)
    return {"lease": claim.lease, "left": (expires - timezone.now()).total_seconds()}


@task()
def default_lease() -> dict[str, Any]:
    return _lease_held()


@task()
@claim_options(lease=120)
def long_lease() -> dict[str, Any]:
    return _lease_held()


@task()
@claim_options(lease=5)
def short_lease() -> dict[str, Any]:
    return _lease_held()


@task()
@claim_options(backoff={"base": 500, "factor": 2, "cap": 10_000, "jitter": 0}, max_attempts=3)
def own_backoff() -> None:
    raise RuntimeError("fails every time")


@task()
def plain_failure() -> None:
    raise RuntimeError("fails every time")


@task()
@claim_options(max_attempts=2)
def two_attempts() -> None:
    raise RuntimeError("fails every time")
