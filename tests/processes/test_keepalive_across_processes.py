"""Keepalive across OS processes: a claim kept alive inside ``atomic()`` holds other processes off,
and a forked child (a Celery prefork worker, say) beats with a heartbeat starter of its own."""

from __future__ import annotations

import time

import pytest

from devtools.polling import wait_until
from django_taskclaim.models import Task

pytestmark = pytest.mark.django_db(transaction=True)


def until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    wait_until(predicate, timeout=timeout, interval=0.02, what="the condition")


def test_keepalive_inside_atomic_holds_off_other_processes(spawn) -> None:  # type: ignore[no-untyped-def]
    """The issue's reproduction with real processes: a 1 s lease, then atomic() + keepalive() for
    over three lease lengths while other processes try to claim the task; none may get it."""
    from django.db import transaction

    claim = Task.objects.claim("job", owner="me", lease=1).claim
    results = []
    with transaction.atomic(), claim.keepalive(interval=0.2):
        until = time.monotonic() + 3.5
        while time.monotonic() < until:
            racer = spawn("race", "job")
            racer.event("ready", timeout=60)
            racer.send("go")
            results.append(racer.finish(30))
    assert results and not any(r["claimed"] for r in results), results
    assert all(r["owner"] == "me" for r in results)
    claim.complete("mine")
    assert Task.objects.get(key="job").owner == "me"


def test_a_forked_child_beats_with_a_starter_of_its_own() -> None:
    """The starter thread does not survive a fork: a child (a Celery prefork worker, say) that
    keeps a claim alive gets its own."""
    import multiprocessing

    from django.db import connections

    claim = Task.objects.claim("warm", lease=30).claim
    with claim.keepalive():  # the parent's starter exists before the fork
        pass
    connections.close_all()
    child = multiprocessing.get_context("fork").Process(target=_child_keeps_alive)
    child.start()
    child.join(60)
    assert child.exitcode == 0
    lease = Task.objects.get(key="forked")
    assert lease.status == "succeeded", lease.status


def _child_keeps_alive() -> None:
    from django.db import connections

    connections.close_all()
    claim = Task.objects.claim("forked", lease=0.6).claim
    before = Task.objects.get(key="forked").lease_expires_at
    with claim.keepalive():
        until(lambda: Task.objects.get(key="forked").lease_expires_at != before)
    claim.complete("ok")
    connections.close_all()
