"""Django tasks that run past their timeout (tests/processes/test_worker_timeouts.py): each tries to
write its effect after its claim was fenced off, and notes what that write met."""

from __future__ import annotations

import asyncio

from devtools.polling import wait_until
from django_taskclaim.exceptions import StaleClaim
from django_taskclaim.tasks import claim_options, current_claim

try:
    from django.tasks import task  # type: ignore[attr-defined,unused-ignore]
except ImportError:
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]

from .models import Effect

#: What each late write met, by task: "refused" (StaleClaim) or "committed".
LATE_WRITES: dict[str, str] = {}


def _write_effect(name: str) -> None:
    claim = current_claim()
    try:
        with claim.fenced():
            Effect.objects.create(task_key=name, token=claim.token, worker="late")
        LATE_WRITES[name] = "committed"
    except StaleClaim:
        LATE_WRITES[name] = "refused"


def _fenced_off() -> bool:
    from django_taskclaim.models import Task

    claim = current_claim()
    return not Task.objects.using(claim.using).filter(pk=claim.task_id, status=Task.Status.RUNNING).exists()


@task()
@claim_options(timeout=0.3, max_attempts=1)
async def sleeps_async() -> str:
    try:
        await asyncio.sleep(30)  # cancelled at the timeout
    except asyncio.CancelledError:
        from asgiref.sync import sync_to_async

        await sync_to_async(_write_effect)("sleeps_async")  # after the fencing: refused
        raise
    return "woke"


@task()
@claim_options(max_attempts=1)
def sleeps_sync() -> str:
    """Runs past ``OPTIONS["TIMEOUT"]`` (a sync body cannot be stopped), then writes its effect."""
    wait_until(_fenced_off, timeout=20, interval=0.02, what="the timeout to fence the claim off")
    _write_effect("sleeps_sync")
    return "woke"
