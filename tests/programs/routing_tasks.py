"""A Django task of the sharded configurations: keyed by a tenant, so it is enqueued in, and run
from, that tenant's task database; its effect is written inside ``fenced()`` (routed there by
``tests.routers.ShardRouter``)."""

from __future__ import annotations

import os

from django_taskclaim import TaskKey
from django_taskclaim.tasks import current_claim, keyed

try:
    from django.tasks import task  # type: ignore[attr-defined,unused-ignore]
except ImportError:
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]

from tests.testapp.models import Effect


@task()
@keyed(lambda tenant, n: TaskKey("invoice", run=str(n), tenant=tenant))
def invoice(tenant: str, n: int) -> str:
    claim = current_claim()
    with claim.fenced():  # the effect commits with the completion, in the tenant's database
        Effect.objects.create(task_key=f"invoice:{tenant}:{n}", token=claim.token, worker=str(os.getpid()))
        claim.complete({"database": claim.using})
    return claim.using
