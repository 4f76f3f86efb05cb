"""The Celery app of the harness's Celery variant: ``celery -A tests.chaos.celery_app worker``.

Configured from the environment the harness sets (``CHAOS_BROKER_URL``, ``CHAOS_LEASE``,
``CHAOS_VISIBILITY_TIMEOUT``, ``CHAOS_STEPS``, ``CHAOS_WORK_MS``, ``CHAOS_EVENTS``), with the
settings the bridge recommends (acks late, reject on worker lost, prefetch 1) and a visibility
timeout shorter than a pause, so that Redis redelivers messages of paused workers (on RabbitMQ
the harness sets the server's ``consumer_timeout`` shorter than a pause to the same end).

Each process appends its events (JSON lines) to ``$CHAOS_EVENTS/<pid>.jsonl``: the claims it
got, and every fenced-off write it was refused (through the ``stale_write_refused`` signal).
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.chaos.settings")
django.setup()

from celery import Celery  # noqa: E402
from django.db import InterfaceError, OperationalError  # noqa: E402

from django_taskclaim import celery as bridge  # noqa: E402
from django_taskclaim import signals  # noqa: E402

LEASE = float(os.environ.get("CHAOS_LEASE", "2"))
STEPS = int(os.environ.get("CHAOS_STEPS", "3"))
WORK_MS = float(os.environ.get("CHAOS_WORK_MS", "100"))
EVENTS = os.environ.get("CHAOS_EVENTS", "")

app = Celery("taskclaim_chaos")
app.conf.update(
    broker_url=os.environ.get("CHAOS_BROKER_URL", "redis://127.0.0.1:6379/0"),
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_serializer="json",
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("CHAOS_VISIBILITY_TIMEOUT", str(2 * LEASE))),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    worker_hijack_root_logger=False,
)


def emit(**event: Any) -> None:
    if not EVENTS:
        return
    with open(os.path.join(EVENTS, f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps({**event, "pid": os.getpid(), "wall": time.time()}, default=str) + "\n")


def _claimed(sender: Any, claim: Any, takeover: bool, **kwargs: Any) -> None:
    emit(event="claimed", task=claim.task_id, key=claim.key, token=claim.token,
         expires=claim.lease_expires_at)


def _refused(sender: Any, key: str, token: int, action: str, **kwargs: Any) -> None:
    emit(event="stale", key=key, token=token, action=action)


signals.task_claimed.connect(_claimed, weak=False, dispatch_uid="chaos-claimed")
signals.stale_write_refused.connect(_refused, weak=False, dispatch_uid="chaos-refused")


# A dropped database connection is transient: Celery retries the task (the bridge records the
# attempt as a retry), as a careful user configures it. Without autoretry_for the bridge ends
# the task FAILED on the first terminated session, by design (no retry decided by Celery).
@bridge.claimed_task(key="{key}", lease=LEASE, on_busy="retry", busy_countdown=LEASE / 2,
              max_attempts=100_000, app=app, bind=True, name="chaos.step_task",
              autoretry_for=(OperationalError, InterfaceError), max_retries=None,
              default_retry_delay=0.2, retry_backoff=False)
def step_task(self: Any, key: str) -> dict[str, Any]:
    """The worker program's task, as a Celery task: progress effects, then effect + completion."""
    from django_taskclaim.store import DbNow
    from tests.testapp.models import Effect

    claim = self.claim
    owner = f"celery:{os.getpid()}"
    rng = random.Random()
    for step in range(STEPS):
        time.sleep(WORK_MS / 1000 * rng.uniform(0.5, 1.5))  # simulated work
        final = step == STEPS - 1
        with claim.fenced():
            effect = Effect.objects.create(task_key=claim.key, token=claim.token,
                                           worker=f"{owner}#{'final' if final else f'step{step}'}")
            Effect.objects.filter(pk=effect.pk).update(created_at=DbNow())
            if final:
                # Completed inside the fence: the bridge keeps this result.
                claim.complete({"owner": owner, "token": claim.token})
    emit(event="done", task=claim.task_id, key=claim.key, token=claim.token)
    return {"owner": owner, "token": claim.token}
