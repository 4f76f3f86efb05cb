"""Migration 0005's triggers: a queued task that becomes PENDING notifies ``taskclaim_wakeup`` with its
queue, on every path that makes one (enqueue, bulk enqueue, retry, release, reset, reclaim), at
commit; a claim, a heartbeat, a completion or a task claimed by key notify nothing."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator

import pytest
from django.db import transaction

from django_taskclaim.models import Task
from django_taskclaim.store.listening import Listener, can_listen
from django_taskclaim.tasks import enqueue_many
from tests.conftest import expire
from tests.testapp import tasks

pytestmark = [
    pytest.mark.skipif(not can_listen("default"), reason="LISTEN/NOTIFY: PostgreSQL, not behind a transaction pooler"),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def heard() -> Iterator[Listener]:
    listener = Listener("default")
    yield listener
    listener.close()


def payloads(listener: Listener) -> list[dict[str, object]]:
    """What reached the listener so far (a notification is delivered when its transaction commits,
    before the statement's reply: nothing to wait for)."""
    return [json.loads(p) for p in listener.receive(0.2)]


def test_an_enqueue_notifies_its_queue_at_commit_and_a_rollback_notifies_nothing(heard: Listener) -> None:
    with transaction.atomic():
        Task.objects.ensure("a", queue="emails")
        assert heard.receive(0) == []  # not before the commit
    assert payloads(heard) == [{"queue": "emails"}]
    with pytest.raises(RuntimeError), transaction.atomic():
        Task.objects.ensure("b", queue="emails")
        raise RuntimeError("rolled back")
    assert payloads(heard) == []


def test_a_bulk_enqueue_of_one_queue_is_one_notification(heard: Listener) -> None:
    enqueue_many(tasks.add, [((i, 1), {}) for i in range(50)])
    assert payloads(heard) == [{"queue": "default"}]


def test_a_deferred_task_is_announced_with_the_seconds_until_it_is_due(heard: Listener) -> None:
    Task.objects.ensure("later", queue="default", run_after=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30))
    [found] = payloads(heard)
    assert found["queue"] == "default" and 29 < found["due_in"] <= 30  # type: ignore[operator]


def test_claims_heartbeats_completions_and_keyed_tasks_notify_nothing(heard: Listener) -> None:
    Task.objects.ensure("q", queue="default")
    payloads(heard)
    [claim] = Task.objects.claim_next(owner="w", lease=30)
    claim.heartbeat()
    claim.complete("done")
    keyed = Task.objects.claim("by-key", lease=30).claim
    assert keyed is not None
    keyed.complete("done")
    assert payloads(heard) == []


def test_every_way_back_to_pending_notifies(heard: Listener) -> None:
    Task.objects.ensure("t", queue="default", max_attempts=5)
    payloads(heard)
    [claim] = Task.objects.claim_next(owner="w", lease=30)
    claim.release()
    assert payloads(heard) == [{"queue": "default"}], "a release"
    [claim] = Task.objects.claim_next(owner="w", lease=30)
    claim.fail("boom", retry=True)
    assert [p["queue"] for p in payloads(heard)] == ["default"], "a retry"
    Task.objects.filter(key="t").update(run_after=None)  # due now, not after its retry's delay
    assert payloads(heard) == [{"queue": "default"}], "a deferred task made due"
    [claim] = Task.objects.claim_next(owner="w", lease=30)
    expire(claim.task_id)
    assert Task.objects.reclaim_expired() == 1
    assert payloads(heard) == [{"queue": "default"}], "a reclaim"
    Task.objects.filter(key="t").cancel()
    assert payloads(heard) == []
    Task.objects.filter(key="t").reset()
    assert payloads(heard) == [{"queue": "default"}], "an operator's reset"
