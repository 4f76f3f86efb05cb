"""Keepalive heartbeats from a background thread, and losing the lease while working."""

from __future__ import annotations

import time

import pytest

from django_taskclaim.exceptions import StaleClaim
from django_taskclaim.models import Task
from tests.conftest import expire

pytestmark = pytest.mark.django_db(transaction=True)


def wait_until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        time.sleep(0.02)


def test_keepalive_renews_the_lease_while_the_block_runs() -> None:
    claim = Task.objects.claim("job", lease=0.6).claim
    seen = set()
    with claim.keepalive():
        # Work that outlives the lease several times over; the lease must keep moving.
        def renewed_twice() -> bool:
            seen.add(Task.objects.get(key="job").lease_expires_at)
            return len(seen) >= 3

        wait_until(renewed_twice)
        assert Task.objects.live().filter(key="job").exists()
    assert not claim.lost.is_set()
    claim.complete("ok")
    assert Task.objects.get(key="job").status == "succeeded"


def test_keepalive_notices_a_takeover_and_raises_at_the_end() -> None:
    claim = Task.objects.claim("job", lease=0.6).claim
    with pytest.raises(StaleClaim, match="keepalive"), claim.keepalive():
        expire(claim)
        assert Task.objects.claim("job", owner="thief").claimed
        assert claim.lost.wait(10), "the keepalive thread did not notice the takeover"
    assert isinstance(claim.lost_reason, StaleClaim)
    assert Task.objects.get(key="job").owner == "thief"


def test_run_once_wait_polls_until_the_owner_finishes(settings) -> None:  # type: ignore[no-untyped-def]
    import threading

    from django.db import connection

    from django_taskclaim import run_once

    settings.TASKCLAIM_POLL_INTERVAL = 0.02
    owner = Task.objects.claim("job", owner="first").claim
    results: list[object] = []

    def waiter() -> None:
        try:
            results.append(run_once("job", lambda: "second ran", on_busy="wait"))
        finally:
            connection.close()

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_until(lambda: Task.objects.get(key="job").attempt_set.filter(outcome="duplicate").exists())
    owner.complete("first result")
    thread.join(10)
    assert results == ["first result"]


def test_run_once_wait_takes_over_when_the_owner_dies(settings) -> None:  # type: ignore[no-untyped-def]
    from django_taskclaim import run_once

    settings.TASKCLAIM_POLL_INTERVAL = 0.02
    Task.objects.claim("job", owner="dead", lease=0.3)
    # The dead owner never heartbeats: once its lease expires by the DB clock, we run it.
    assert run_once("job", lambda: "recovered", on_busy="wait", lease=5) == "recovered"
    task = Task.objects.get(key="job")
    assert (task.fencing_token, task.result) == (2, "recovered")


def test_run_once_inside_a_transaction_needs_no_heartbeat() -> None:
    """A view under ATOMIC_REQUESTS: the claim is uncommitted, its row lock holds the task."""
    from django.db import transaction

    from django_taskclaim import run_once

    def slow() -> str:
        # Longer than the lease: a heartbeat from another connection would find no claim.
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            time.sleep(0.05)
        return "done in one transaction"

    with transaction.atomic():
        assert run_once("job", slow, lease=0.3) == "done in one transaction"
    assert Task.objects.get(key="job").result == "done in one transaction"
