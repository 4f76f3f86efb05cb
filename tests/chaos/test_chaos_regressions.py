"""Regression tests for core bugs the fault-injection harness found (docs/fault-injection.md).

Each test reproduces the interleaving the harness caught, deterministically, with real OS
processes and real row locks.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection

from django_taskclaim.models import Attempt, Task
from tests.conftest import MYSQL_LOCK_WAITS, expire

pytestmark = pytest.mark.django_db(transaction=True)


def wait_until_blocked_on_a_lock(pid: int, deadline: float = 15.0) -> None:
    """Poll until the backend serving OS process ``pid``'s claim waits for a row lock."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        with connection.cursor() as cursor:
            if connection.vendor == "mysql":
                cursor.execute(MYSQL_LOCK_WAITS)
            else:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database() AND pid <> pg_backend_pid()")
            if cursor.fetchone()[0]:
                return
        time.sleep(0.02)  # polling the server's lock waits is the point
    raise AssertionError(f"the claim of process {pid} never waited for the row lock")


def test_attempts_of_a_task_do_not_overlap_when_a_claim_waits_for_a_release(spawn) -> None:  # type: ignore[no-untyped-def]
    """Seed 20261202 of the long run: ``token 1 (released) ended 14:29:55.890203, token 2
    started 14:29:55.889141``.

    A claim that *arrives* while the owner still holds the row (here: inside ``fenced()``,
    after its lease expired) waits for the lock; the owner releases and commits; the waiting claim then takes the task.
    Its attempt was stamped with ``statement_timestamp()`` — the time the claim statement
    arrived, before the release — so the audit trail showed the new claim starting before the
    old one ended: an overlap of two claims on the database clock, which never happened.
    """
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has one writer: a claim never waits inside a statement for a release")
    first = Task.objects.claim("overlap-after-release", lease=30).claim
    assert first is not None
    # An expired lease makes the row claimable in the racer's snapshot, so its claim waits for
    # the owner's lock (a live row is refused at once, without waiting).
    expire(first)
    racer = spawn("race", "overlap-after-release", "--lease", "30")
    racer.event("ready", timeout=60)
    with first.fenced():
        racer.send("go")
        wait_until_blocked_on_a_lock(racer.pid)
        first.release()  # arrives after the racer's claim, commits before it runs
    done = racer.event("done", timeout=60)
    assert done["claimed"] is True and done["token"] == 2, done
    one, two = Attempt.objects.filter(task_id=first.task_id).order_by("token")
    assert (one.token, one.outcome, two.token) == (1, "released", 2)
    assert one.ended_at is not None
    assert one.ended_at <= two.started_at, (
        f"attempt 2 started at {two.started_at}, before attempt 1 ended at {one.ended_at}")


@pytest.mark.parametrize("how", ["an error in the block", "a failed COMMIT"])
def test_a_completion_rolled_back_with_its_fenced_block_leaves_the_claim_unfinished(how: str) -> None:
    """Seed 20261205 of the 5-minute failover run: five refusals that workers reported as
    ``StaleClaim`` were missing from ``Attempt.stale_writes``.

    A worker completed its task inside ``fenced()``; the COMMIT failed (the primary was killed,
    or the session terminated, at that moment), so the task stayed RUNNING under its token.
    Its lease ran out while the worker reconnected and another worker took the task over. The
    worker's next heartbeat was refused, but not counted and not signalled: the claim still
    believed that it had completed the task itself, and took the refusal for a heartbeat racing
    its own completion. Here the block rolls back by an exception, deterministically; the
    claim must come out of it as it went in.
    """
    from django.db import IntegrityError, connection

    from django_taskclaim import signals
    from django_taskclaim.exceptions import StaleClaim

    claim = Task.objects.claim("completion-rolled-back", lease=30).claim
    assert claim is not None
    if how == "an error in the block":
        with pytest.raises(RuntimeError, match="never committed"), claim.fenced():
            claim.complete({"by": "the first owner"})
            raise RuntimeError("never committed")
    else:
        if connection.vendor == "mysql":
            pytest.skip("InnoDB checks foreign keys at once, never at COMMIT")
        # Django's foreign keys are checked at COMMIT on PostgreSQL and SQLite (deferred): the
        # COMMIT of this block fails, after the completion was written in it.
        with pytest.raises(IntegrityError), claim.fenced():
            claim.complete({"by": "the first owner"})
            Attempt.objects.create(task_id=claim.task_id + 1000, token=1, owner="nobody")
    assert Task.objects.get(pk=claim.task_id).status == Task.Status.RUNNING
    expire(claim)
    taker = Task.objects.claim("completion-rolled-back", lease=30).claim
    assert taker is not None and taker.token == 2
    refused: list[str] = []

    def count(sender: object, action: str, **kwargs: object) -> None:
        refused.append(action)

    signals.stale_write_refused.connect(count, weak=False, dispatch_uid="test-rolled-back-completion")
    try:
        with pytest.raises(StaleClaim):
            claim.heartbeat()
    finally:
        signals.stale_write_refused.disconnect(dispatch_uid="test-rolled-back-completion")
    assert Attempt.objects.get(task_id=claim.task_id, token=1).stale_writes == 1
    assert refused == ["heartbeat"]
