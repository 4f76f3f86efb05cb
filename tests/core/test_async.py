"""The async API: the same outcomes, fencing and takeovers as the sync API, from coroutines.

Each test drives an event loop with ``asyncio.run``; the ORM work runs on asgiref's
thread-sensitive thread, whose connections are closed before the loop ends.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import AsyncClient, override_settings

from django_taskclaim import arun_once
from django_taskclaim.exceptions import InvalidResult, StaleClaim, TaskBusy, TaskFailed
from django_taskclaim.models import Attempt, Task
from tests.conftest import expire
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    async def main() -> T:
        try:
            return await coro
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(main())


async def poll(predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    """Await until ``predicate()`` (a coroutine function) is true; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        await asyncio.sleep(0.02)


@pytest.fixture(autouse=True)
def fast_polls(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKCLAIM_POLL_INTERVAL = 0.02


# -- the manager and the claim, awaited ------------------------------------------------------

def test_the_async_calls_have_the_sync_outcomes() -> None:
    async def scenario() -> None:
        task = await Task.objects.aensure("job", payload={"n": 1})
        assert (task.status, task.fencing_token) == ("pending", 0)
        won = await Task.objects.aclaim("job", owner="a", lease=5, payload={"n": 1})
        assert won.claimed and won.claim is not None and won.claim.token == 1
        lost = await Task.objects.aclaim("job", owner="b")
        assert not lost.claimed and lost.claim is None
        assert (lost.task.status, lost.task.owner) == ("running", "a")
        claim = won.claim
        before = claim.lease_expires_at
        assert await claim.aheartbeat(30) is not None and claim.lease_expires_at > before
        await claim.acheck()
        await claim.acomplete({"ok": True}, result_ref="s3://x")
        done = await Task.objects.aclaim("job")
        assert (done.claimed, done.task.status, done.task.result) == (False, "succeeded", {"ok": True})

    run(scenario())


def test_afail_arelease_aclaim_next_and_areclaim_expired() -> None:
    async def scenario() -> None:
        for key in ("a", "b"):
            await Task.objects.aensure(key, max_attempts=2, queue="default")
        await Task.objects.aensure("c", max_attempts=2)  # claimed by key (a queued task never is)
        first, second = await Task.objects.aclaim_next(owner="w", lease=5, limit=2)
        assert await first.afail("boom", retry=True, delay=0) == "pending"
        await second.arelease()
        assert (await Task.objects.aget(key=second.key)).attempts == 0
        [again] = await Task.objects.aclaim_next(owner="w", lease=5)
        assert again.key == first.key and again.token == 2
        assert await again.afail(ValueError("no"), retry=True) == "failed"  # attempts spent
        held = (await Task.objects.aclaim("c", lease=5)).claim
        assert held is not None
        await sync_to_async(expire)(held)
        assert await Task.objects.areclaim_expired() == 1
        assert (await Task.objects.aget(key="c")).status == "pending"

    run(scenario())


def test_astart_and_arelease_with_a_delay() -> None:
    """The awaitable twins of a reserved claim's start and of a release with a "not before" time."""
    async def scenario() -> None:
        for key in ("a", "b"):
            await Task.objects.aensure(key, queue="default")
        first, second = await Task.objects.aclaim_next(owner="w", lease=5, limit=2, reserve=True)
        assert second.reserved and (await Task.objects.aget(key="b")).attempts == 0
        await second.astart()
        assert not second.reserved and (await Task.objects.aget(key="b")).attempts == 1
        await first.arelease(delay=60, reason="not yet")
        task = await Task.objects.aget(key="a")
        assert (task.status, task.attempts, task.error) == ("pending", 0, "not yet")
        assert await Task.objects.aclaim_next(owner="w", lease=5) == []  # a not due yet, b running

    run(scenario())


def test_a_taken_over_claim_is_fenced_off_in_async_code() -> None:
    async def scenario() -> None:
        old = (await Task.objects.aclaim("job", owner="slow", lease=5)).claim
        assert old is not None
        await sync_to_async(expire)(old)
        new = (await Task.objects.aclaim("job", owner="fresh", lease=5)).claim
        assert new is not None and new.token == old.token + 1

        def publish(claim: Any) -> str:
            Effect.objects.create(task_key="job", token=claim.token, worker=claim.owner)
            claim.complete({"by": claim.owner})
            return "published"

        for stale_call in (old.aheartbeat(), old.acheck(), old.afenced(publish, old), old.acomplete("late")):
            with pytest.raises(StaleClaim):
                await stale_call
        assert await Effect.objects.acount() == 0  # the stale fenced write left nothing behind
        assert await new.afenced(publish, new) == "published"
        task = await Task.objects.aget(key="job")
        assert (task.status, task.result, task.fencing_token) == ("succeeded", {"by": "fresh"}, 2)
        assert [e.token async for e in Effect.objects.all()] == [2]
        stale = await Attempt.objects.aget(task=task, token=1)
        assert stale.stale_writes == 4

    run(scenario())


# -- akeepalive --------------------------------------------------------------------------------

def test_akeepalive_renews_the_lease_from_an_asyncio_task() -> None:
    async def scenario() -> None:
        claim = (await Task.objects.aclaim("job", lease=0.6)).claim
        assert claim is not None
        seen: set[Any] = set()

        async def renewed_three_times() -> bool:
            seen.add((await Task.objects.aget(key="job")).lease_expires_at)
            return len(seen) >= 4

        async with claim.akeepalive():
            await poll(renewed_three_times)  # the coroutine outlives its lease several times
            assert await Task.objects.live().filter(key="job").aexists()
        assert not claim.lost.is_set()
        await claim.acomplete("ok")

    run(scenario())


def test_akeepalive_notices_a_takeover_and_raises_at_the_end() -> None:
    async def scenario() -> None:
        claim = (await Task.objects.aclaim("job", lease=0.6)).claim
        assert claim is not None
        with pytest.raises(StaleClaim, match="keepalive"):
            async with claim.akeepalive():
                await sync_to_async(expire)(claim)
                assert (await Task.objects.aclaim("job", owner="thief")).claimed

                async def lost() -> bool:
                    return claim.lost.is_set()

                await poll(lost)
        assert isinstance(claim.lost_reason, StaleClaim)
        assert (await Task.objects.aget(key="job")).owner == "thief"

    run(scenario())


# -- arun_once -------------------------------------------------------------------------------

def test_arun_once_with_many_callers_in_one_event_loop_runs_once_and_all_get_the_result() -> None:
    runs: list[int] = []

    async def work(n: int) -> dict[str, int]:
        runs.append(n)
        await asyncio.sleep(0.3)  # every other caller arrives while this one runs
        return {"n": n}

    async def scenario() -> list[Any]:
        return await asyncio.gather(*(arun_once("job", work, 7, on_busy="wait", lease=5) for _ in range(20)))

    results = run(scenario())
    assert runs == [7]
    assert results == [{"n": 7}] * 20
    outcomes = Counter(Attempt.objects.values_list("outcome", flat=True))
    assert outcomes["succeeded"] == 1 and outcomes["running"] == 0
    assert Attempt.objects.filter(token__isnull=False).count() == 1  # one claim; the rest read


def test_arun_once_wait_takes_over_when_the_owner_dies() -> None:
    Task.objects.claim("job", owner="dead", lease=0.3)  # it never heartbeats again

    async def recover() -> str:
        return "recovered"

    assert run(arun_once("job", recover, on_busy="wait", lease=5)) == "recovered"
    task = Task.objects.get()
    assert (task.fencing_token, task.result, task.owner != "dead") == (2, "recovered", True)
    assert Attempt.objects.get(token=1).outcome == "taken_over"


def test_arun_once_raise_gives_one_result_and_task_busy_to_the_others() -> None:
    async def work() -> str:
        await asyncio.sleep(0.3)
        return "done"

    async def scenario() -> list[Any]:
        return await asyncio.gather(*(arun_once("job", work, lease=5) for _ in range(8)), return_exceptions=True)

    results = run(scenario())
    assert results.count("done") == 1
    assert all(isinstance(r, TaskBusy) for r in results if r != "done"), results
    assert run(arun_once("job", work)) == "done"  # later callers read the stored result


def test_arun_once_records_a_failure_and_runs_again_next_time() -> None:
    async def boom() -> None:
        raise RuntimeError("model timed out")

    async def fine() -> str:
        return "second try"

    with pytest.raises(RuntimeError, match="model timed out"):
        run(arun_once("job", boom))
    task = Task.objects.get()
    assert (task.status, task.error) == ("pending", "RuntimeError: model timed out")
    assert run(arun_once("job", fine)) == "second try"


def test_arun_once_whose_result_cannot_be_stored_ends_failed_and_never_runs_again() -> None:
    runs: list[int] = []

    async def unstorable() -> object:
        runs.append(1)
        return {"at": object()}

    with pytest.raises(InvalidResult, match="JSON"):
        run(arun_once("job", unstorable))
    assert Task.objects.get().status == "failed"
    with pytest.raises(TaskFailed):
        run(arun_once("job", unstorable, on_busy="wait"))
    assert runs == [1]


# -- async views under Django's AsyncClient ----------------------------------------------------

@override_settings(ROOT_URLCONF="tests.programs.async_views")
def test_concurrent_requests_to_an_async_view_run_the_work_once() -> None:
    async def scenario() -> list[Any]:
        client = AsyncClient()
        return await asyncio.gather(*(client.post("/run/report-1") for _ in range(10)))

    responses = run(scenario())
    assert [r.status_code for r in responses] == [200] * 10
    effect = Effect.objects.get()
    assert all(r.json() == {"result": {"key": "report-1", "by": effect.worker}, "served_by": effect.worker}
               for r in responses)


@override_settings(ROOT_URLCONF="tests.programs.async_views")
def test_an_async_view_writes_its_effect_through_afenced() -> None:
    async def scenario() -> tuple[Any, Any]:
        client = AsyncClient()
        return await client.post("/fenced/pay-1"), await client.post("/fenced/pay-1")

    first, second = run(scenario())
    assert first.json() == {"claimed": True, "token": 1}
    assert second.json() == {"claimed": False, "status": "succeeded", "result": {"token": 1}}
    assert list(Effect.objects.values_list("token", flat=True)) == [1]
