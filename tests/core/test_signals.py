"""Signals fire once per event in one process, with the fields receivers rely on; structured logs.

That they fire once per event across several worker processes is
tests/processes/test_signals_across_processes.py.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from tests.programs.signal_recorder import connect_recorder, disconnect_recorder


@pytest.fixture
def recorded():  # type: ignore[no-untyped-def]
    records: list[dict[str, Any]] = []
    lock = threading.Lock()

    def sink(record: dict[str, Any]) -> None:
        with lock:
            records.append(record)

    connect_recorder(sink)
    yield records
    disconnect_recorder()


def names(records: list[dict[str, Any]]) -> list[str]:
    return [r["signal"] for r in records]


@pytest.mark.django_db(transaction=True)
def test_claim_complete_and_duplicate(recorded) -> None:  # type: ignore[no-untyped-def]
    from django_taskclaim.models import Task

    claim = Task.objects.claim("s-1", tenant="t", owner="a", lease=60).claim
    assert claim
    Task.objects.claim("s-1", tenant="t", owner="b", delivery_id="m-2")
    claim.complete({"x": 1}, result_ref="ref")
    assert names(recorded) == ["task_claimed", "duplicate_delivery", "task_completed"]
    assert recorded[0] | {"pid": 0} == {"signal": "task_claimed", "pid": 0, "key": "s-1",
                                        "tenant": "t", "token": 1, "owner": "a", "takeover": False}
    assert recorded[1]["owner"] == "b" and recorded[1]["delivery_id"] == "m-2"


@pytest.mark.django_db(transaction=True)
def test_operator_release_and_reclaim(recorded) -> None:  # type: ignore[no-untyped-def]
    from django_taskclaim.models import Task
    from tests.conftest import expire

    for key in ("r-1", "r-2"):
        Task.objects.claim(key, tenant="t", lease=600)
    recorded.clear()
    assert Task.objects.filter(key__startswith="r-").force_release() == 2
    assert sorted((r["signal"], r["key"], r["tenant"]) for r in recorded) == [
        ("task_released", "r-1", "t"), ("task_released", "r-2", "t")]
    recorded.clear()
    for key in ("e-1", "e-2"):
        c = Task.objects.claim(key, lease=600).claim
        expire(c)
    recorded.clear()
    assert Task.objects.reclaim_expired() == 2
    assert names(recorded) == ["tasks_reclaimed"]  # one signal for the whole batch
    assert sorted(row[0] for row in recorded[0]["tasks"]) == ["e-1", "e-2"]
    assert {row[3] for row in recorded[0]["tasks"]} == {"pending"}


@pytest.mark.django_db(transaction=True)
def test_no_signal_for_a_rolled_back_claim(recorded) -> None:  # type: ignore[no-untyped-def]
    from django.db import transaction

    from django_taskclaim.models import Task

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        Task.objects.claim("rb-1")
        raise Abort
    assert recorded == []
    assert not Task.objects.filter(key="rb-1").exists()


@pytest.mark.django_db(transaction=True)
def test_heartbeat_lost_and_takeover(recorded) -> None:  # type: ignore[no-untyped-def]
    from django_taskclaim.exceptions import StaleClaim
    from django_taskclaim.models import Task
    from tests.conftest import expire

    claim = Task.objects.claim("hb-1", owner="slow", lease=0.6).claim
    assert claim
    with pytest.raises(StaleClaim), claim.keepalive(interval=0.05):
        expire(claim)
        Task.objects.claim("hb-1", owner="fast")
        assert claim.lost.wait(10), "the keepalive never noticed the takeover"
    assert names(recorded).count("heartbeat_lost") == 1
    assert names(recorded).count("task_taken_over") == 1
    lost = next(r for r in recorded if r["signal"] == "heartbeat_lost")
    assert (lost["key"], lost["token"], lost["owner"]) == ("hb-1", 1, "slow")
    over = next(r for r in recorded if r["signal"] == "task_taken_over")
    assert (over["token"], over["previous_owner"], over["previous_token"]) == (2, "slow", 1)
    stale = [r for r in recorded if r["signal"] == "stale_write_refused"]
    assert [(r["action"], r["token"]) for r in stale] == [("heartbeat", 1)]


@pytest.mark.django_db(transaction=True)
def test_structured_logs(caplog) -> None:  # type: ignore[no-untyped-def]
    from django_taskclaim.exceptions import StaleClaim
    from django_taskclaim.models import Task
    from tests.conftest import expire

    caplog.set_level(logging.INFO, logger="django_taskclaim")
    claim = Task.objects.claim("log-1", tenant="t", owner="w1", lease=60).claim
    assert claim
    expire(claim)
    Task.objects.claim("log-1", tenant="t", owner="w2")
    with pytest.raises(StaleClaim):
        claim.complete()
    records = [r for r in caplog.records if r.name == "django_taskclaim"]
    # The message names the task after its first words (tests/core/test_logs.py); the fields are the same.
    fields = [(r.getMessage().split(":")[0], r.key, r.tenant, r.token, r.owner) for r in records]  # type: ignore[attr-defined]
    assert ("task claimed", "log-1", "t", 1, "w1") in fields
    assert ("task taken over", "log-1", "t", 2, "w2") in fields
    refused = next(r for r in records if r.levelno == logging.WARNING)
    assert (refused.key, refused.token, refused.action) == ("log-1", 1, "complete")  # type: ignore[attr-defined]
