"""Leases renewed together (issue 32, item 2): a worker with many tasks in flight renews them all in
one statement a round, by id and token each, and a claim taken over is told to its own task only."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from devtools.polling import wait_until
from django_taskclaim.lifecycle import transitions
from django_taskclaim.models import Task
from django_taskclaim.worker import work
from tests.conftest import expire

pytestmark = pytest.mark.django_db(transaction=True)


class Rounds:
    """Counts the renewal statements (and single heartbeats) the worker sends, calling through."""

    def __init__(self, monkeypatch: Any) -> None:
        self.lock = threading.Lock()
        self.batches: list[list[int]] = []
        self.singles = 0
        many, single = transitions.heartbeat_many, transitions.heartbeat

        def heartbeat_many(using: str, held: Any, lease: float) -> Any:
            with self.lock:
                self.batches.append([pk for pk, _ in held])
            return many(using, held, lease)

        def heartbeat(holder: Any, lease: float) -> Any:
            with self.lock:
                self.singles += 1
            return single(holder, lease)

        monkeypatch.setattr(transitions, "heartbeat_many", heartbeat_many)
        monkeypatch.setattr(transitions, "heartbeat", heartbeat)

    def count(self) -> int:
        with self.lock:
            return len(self.batches)


def queue(n: int, prefix: str) -> list[str]:
    keys = [f"{prefix}{i:03d}" for i in range(n)]
    for key in keys:
        Task.objects.ensure(key, queue="default")
    return keys


def waiting_for(condition: Callable[[], bool], what: str) -> Callable[[Any], str]:
    def handler(claim):  # type: ignore[no-untyped-def]
        wait_until(condition, timeout=30, interval=0.02, what=what)
        return claim.key
    return handler


def test_sixteen_tasks_in_flight_are_renewed_in_one_statement_a_round(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    keys = queue(16, "r")
    rounds = Rounds(monkeypatch)
    everyone = threading.Barrier(16, timeout=30)

    def handler(claim):  # type: ignore[no-untyped-def]
        everyone.wait()  # all sixteen in flight, then three rounds of renewals
        wait_until(lambda: rounds.count() >= 3, timeout=30, interval=0.02, what="three renewal rounds")
        return claim.key

    # A lease long enough for sixteen threads' starts on SQLite's one writer on a loaded machine.
    stats = work(handler, owner="many", lease=1.5, concurrency=16, batch=16, until_drained=True, poll=0.05)
    assert stats.succeeded == 16
    assert rounds.singles == 0  # no heartbeat of its own for any task
    # Every round renewed the tasks then in flight together: the sixteen of them, once all started.
    assert max(len(batch) for batch in rounds.batches) == 16
    ids = set(Task.objects.filter(key__in=keys).values_list("pk", flat=True))
    assert all(set(batch) <= ids for batch in rounds.batches)


def test_a_task_taken_over_is_told_alone_and_the_others_run_on(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    queue(3, "t")
    rounds = Rounds(monkeypatch)
    lost: dict[str, bool] = {}
    in_flight = threading.Barrier(3, timeout=30)
    taken = threading.Event()

    def handler(claim):  # type: ignore[no-untyped-def]
        in_flight.wait()
        if claim.key == "t001":
            expire(claim)  # its lease runs out, and a rival takes it over
            [rival] = Task.objects.claim_next(owner="rival", lease=60)
            assert rival.key == "t001"
            taken.set()
            wait_until(claim.lost.is_set, timeout=30, interval=0.02, what="t001's claim to be marked lost")
        else:
            taken.wait(30)
            seen = rounds.count()
            wait_until(lambda: rounds.count() >= seen + 2, timeout=30, interval=0.02, what="two more rounds")
        lost[claim.key] = claim.lost.is_set()
        return claim.key

    stats = work(handler, owner="mine", lease=1.2, concurrency=3, batch=3, max_tasks=3)
    assert lost == {"t000": False, "t001": True, "t002": False}
    assert (stats.succeeded, stats.fenced_off) == (2, 1)
    t001 = Task.objects.get(key="t001")
    assert (t001.status, t001.owner, t001.fencing_token) == (Task.Status.RUNNING, "rival", 2)
    assert rounds.singles == 0


def test_heartbeat_many_renews_the_pairs_that_still_hold_in_one_statement(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    queue(3, "h")
    claims = Task.objects.claim_next(owner="w", lease=30, limit=3)
    expire(claims[1])
    [rival] = Task.objects.claim_next(owner="rival", lease=30)
    assert rival.task_id == claims[1].task_id
    held = [(c.task_id, c.token) for c in claims]
    with django_assert_num_queries(2 if connection.vendor == "mysql" else 1):
        renewed = transitions.heartbeat_many("default", held, 45)
    assert set(renewed) == {claims[0].task_id, claims[2].task_id}
    for claim in (claims[0], claims[2]):
        row = Task.objects.get(pk=claim.task_id)
        assert row.lease_expires_at == renewed[claim.task_id]
        assert (row.lease_expires_at - row.updated_at).total_seconds() == pytest.approx(45, abs=1)


@pytest.mark.parametrize("in_flight", [1, 16, pytest.param(500, marks=pytest.mark.slow)])
def test_the_heartbeat_load_does_not_grow_with_the_tasks_in_flight(monkeypatch, in_flight: int) -> None:  # type: ignore[no-untyped-def]
    """L tasks in flight (async, on one event loop), lease 0.9 s (a renewal due every 0.3 s): the
    statements sent in 1.5 s once all are in flight. A heartbeat per claim would send L / 0.3 a
    second; renewed together it is at most two rounds an interval, one statement each, whatever L.
    (One task at a time, ``concurrency=1``, keeps its heartbeat of its own: one statement an interval.)"""
    Task.objects.bulk_create([Task(key=f"l{i:04d}", queue="default") for i in range(in_flight)])
    rounds = Rounds(monkeypatch)
    window, every = 1.5, 0.3
    state: dict[str, Any] = {"started": 0, "all": asyncio.Event()}  # bound to the pool's loop at first use

    def sent() -> int:
        return rounds.count() + rounds.singles

    async def handler(claim):  # type: ignore[no-untyped-def]
        state["started"] += 1
        if state["started"] == in_flight:
            state["seen"] = sent()
            state["all"].set()
        await state["all"].wait()
        await asyncio.sleep(window)
        state.setdefault("sent", sent() - state["seen"])

    stats = work(handler, owner="load", lease=3 * every, concurrency=in_flight, batch=500, until_drained=True,
                 poll=0.05)
    assert stats.succeeded == in_flight
    assert rounds.singles == 0 or in_flight == 1
    per_second = state["sent"] / window
    print(f"\n{in_flight} in flight: {state['sent']} renewal statements in {window} s "
          f"({per_second:.1f}/s at a {every} s interval; {per_second * every / 10:.2f}/s at lease 30 s)")
    assert state["sent"] <= 2 * window / every + 2
