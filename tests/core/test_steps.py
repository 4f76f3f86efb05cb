"""Durable steps inside one task (issue 43 part 1): ``claim.step`` and ``claim.astep``.

A step's result is stored under the task by a fenced write the first time it returns; a later
attempt gets it without calling the function again; a stale owner's step stores nothing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import Coroutine
from decimal import Decimal
from typing import Any, TypeVar

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.db import Error as DbError
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext

from django_taskclaim import run_once
from django_taskclaim.exceptions import InvalidArgument, StaleClaim, TimedOut
from django_taskclaim.execution import current_claim
from django_taskclaim.models import Step, Task
from tests.conftest import expire
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

T = TypeVar("T")


class Calls:
    """A step function that counts its calls and returns what it is given."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, value: Any = None) -> Any:
        self.count += 1
        return value


def claim_of(key: str, **kwargs: Any) -> Any:
    outcome = Task.objects.claim(key, **kwargs)
    assert outcome.claimed, f"expected to claim {key}, found {outcome.task.status}"
    return outcome.claim


def steps_of(key: str) -> dict[str, tuple[Any, int]]:
    return {s.name: (s.result, s.token) for s in Step.objects.filter(task__key=key)}


def test_a_step_runs_once_and_a_takeover_gets_its_stored_result() -> None:
    first, calls = claim_of("job", owner="w1", lease=30), Calls()
    assert first.step("fetch", calls, {"rows": 3}) == {"rows": 3}
    assert calls.count == 1
    assert steps_of("job") == {"fetch": ({"rows": 3}, 1)}
    expire(first)  # the owner dies; its lease runs out
    second = claim_of("job", owner="w2")
    assert second.step("fetch", calls, {"rows": 99}) == {"rows": 3}  # stored, not called again
    assert calls.count == 1
    assert second.step("publish", calls, "ok") == "ok"
    second.complete("done")
    assert steps_of("job") == {"fetch": ({"rows": 3}, 1), "publish": ("ok", 2)}


def test_a_retry_after_an_error_gets_the_steps_stored_before_it() -> None:
    claim, calls = claim_of("job"), Calls()
    claim.step("one", calls, 1)

    def broken() -> None:
        raise ValueError("the model is down")

    with pytest.raises(ValueError, match="the model is down"):
        claim.step("two", broken)
    claim.fail("the model is down", retry=True)
    assert steps_of("job") == {"one": (1, 1)}  # an error is not stored
    again = claim_of("job")
    assert again.step("one", calls, 100) == 1
    assert again.step("two", calls, 2) == 2
    assert calls.count == 2


def test_a_stale_owners_step_stores_nothing() -> None:
    stale, calls = claim_of("job", owner="w1"), Calls()
    stale.step("one", calls, 1)  # its steps are read now
    expire(stale)
    fresh = claim_of("job", owner="w2")
    with pytest.raises(StaleClaim):
        stale.step("two", calls, "stale")  # the function ran; its result is refused
    assert calls.count == 2
    assert steps_of("job") == {"one": (1, 1)}
    assert fresh.step("two", calls, "fresh") == "fresh"
    expire(fresh)
    claim_of("job", owner="w3")
    with pytest.raises(StaleClaim):
        fresh.step("three", calls, 3)
    assert calls.count == 4
    # A stale claim that never read the steps is refused before its function is called.
    lost = Task.objects.claim("other", owner="w1").claim
    expire(lost)
    claim_of("other", owner="w2")
    with pytest.raises(StaleClaim):
        lost.step("first", calls, 1)
    assert calls.count == 4  # the last one never called its function
    assert steps_of("job") == {"one": (1, 1), "two": ("fresh", 2)}


def test_a_result_that_cannot_be_stored_stores_nothing_and_keeps_the_claim() -> None:
    claim, calls = claim_of("job"), Calls()
    with pytest.raises(InvalidArgument, match="step 'bad'.*not JSON-serialisable"):
        claim.step("bad", calls, {1, 2})
    with pytest.raises(InvalidArgument, match="NUL"):
        claim.step("bad", calls, "a\x00b")
    assert steps_of("job") == {}
    assert claim.step("bad", calls, [1, 2]) == [1, 2]
    claim.complete("done")
    assert Task.objects.get(key="job").status == "succeeded"


def test_bad_names_and_functions_are_refused_before_anything_runs() -> None:
    claim, calls = claim_of("job"), Calls()
    for name, error in [("", "empty"), (None, "must be a string"), ("x" * 201, "201 characters"),
                        ("a\x00", "NUL")]:
        with pytest.raises(InvalidArgument, match=error):
            claim.step(name, calls)
    with pytest.raises(InvalidArgument, match="needs a function"):
        claim.step("x", 42)

    async def coroutine_function() -> int:
        return 1

    with pytest.raises(InvalidArgument, match="returned an awaitable; await claim.astep"):
        claim.step("x", coroutine_function)
    for timeout in (0, -1, "5", float("nan"), True):
        with pytest.raises(InvalidArgument, match="timeout"):
            claim.step_with("x", timeout=timeout)(calls)
    assert calls.count == 0 and steps_of("job") == {}


def test_the_result_is_returned_as_every_attempt_reads_it() -> None:
    claim, calls = claim_of("job"), Calls()
    first = claim.step("values", calls, (1, Decimal("1.50"), dt.date(2026, 1, 2)))
    assert first == [1, "1.50", "2026-01-02"]
    expire(claim)
    assert claim_of("job").step("values", calls) == first
    other = claim_of("other")
    assert other.step("nothing", calls) is None
    assert other.step("nothing", calls, "else") is None  # stored: None, not "absent"
    assert calls.count == 2


def test_a_name_is_one_step_and_keywords_of_the_function_are_its_own() -> None:
    claim = claim_of("job")

    def fetch(url: str, *, name: str, timeout: float, fn: str) -> str:
        return f"{url} {name} {timeout} {fn}"

    assert claim.step("fetch", fetch, "u", name="n", timeout=5, fn="f") == "u n 5 f"
    assert claim.step("fetch", fetch, "other", name="n", timeout=5, fn="f") == "u n 5 f"
    longest = "s" * 200  # the longest name is one an idempotency key takes as its effect
    assert claim.step(longest, lambda: claim.idempotency_key(effect=longest)) == claim.idempotency_key(effect=longest)


def test_a_stored_step_costs_at_most_one_statement() -> None:
    claim = claim_of("job")
    for n in range(5):
        claim.step(f"s{n}", Calls(), n)
    expire(claim)
    again, calls = claim_of("job"), Calls()
    db = connections[again.using]
    with CaptureQueriesContext(db) as first:
        assert again.step("s0", calls) == 0
    with CaptureQueriesContext(db) as rest:
        assert [again.step(f"s{n}", calls) for n in range(1, 5)] == [1, 2, 3, 4]
    assert len(first.captured_queries) == 1, first.captured_queries  # the steps read with the claim's check
    assert len(rest.captured_queries) == 0, rest.captured_queries
    with CaptureQueriesContext(db) as new:
        assert again.step("s5", calls, 5) == 5
    assert len(new.captured_queries) == 1, new.captured_queries  # one fenced insert
    assert calls.count == 1


def test_a_step_inside_fenced_commits_with_the_block_or_not_at_all() -> None:
    claim, calls = claim_of("job"), Calls()

    class Boom(Exception):
        pass

    with pytest.raises(Boom), claim.fenced():
        Effect.objects.using(claim.using).create(task_key="job", token=claim.token, worker="w")
        claim.step("charge", calls, "charged")
        raise Boom
    assert steps_of("job") == {} and not Effect.objects.using(claim.using).exists()
    with claim.fenced():
        assert claim.step("charge", calls, "charged again") == "charged again"  # rolled back: runs again
        Effect.objects.using(claim.using).create(task_key="job", token=claim.token, worker="w")
        assert claim.step("charge", calls, "third") == "charged again"  # stored in this block
    assert calls.count == 2
    assert steps_of("job") == {"charge": ("charged again", 1)}
    assert claim.step("charge", calls) == "charged again"
    with transaction.atomic(using=claim.using):
        claim.step("inside", calls, 1)
        transaction.set_rollback(True, using=claim.using)
    assert claim.step("inside", calls, 2) == 2
    assert calls.count == 4


def test_a_step_with_autocommit_off_commits_or_rolls_back_with_the_callers_transaction() -> None:
    claim, calls = claim_of("job"), Calls()
    claim.step("first", calls, 1)  # the stored steps are read in autocommit
    transaction.set_autocommit(False, using=claim.using)
    try:
        assert claim.step("kept", calls, "kept") == "kept"
        assert claim.step("kept", calls, "again") == "kept"  # stored in the open transaction
        transaction.commit(using=claim.using)
        claim.step("dropped", calls, "dropped")
        transaction.rollback(using=claim.using)
        assert claim.step("dropped", calls, "run again") == "run again"
        transaction.commit(using=claim.using)
    finally:
        transaction.set_autocommit(True, using=claim.using)
    assert calls.count == 4
    assert steps_of("job") == {"first": (1, 1), "kept": ("kept", 1), "dropped": ("run again", 1)}


def test_a_sync_step_past_its_timeout_stores_nothing() -> None:
    claim, calls = claim_of("job"), Calls()

    def slow() -> str:
        time.sleep(0.3)  # the work itself takes this long: a sync step cannot be stopped
        return "late"

    with pytest.raises(TimedOut, match="step 'slow' ran past its timeout of 0.1 s"):
        claim.step_with("slow", timeout=0.1)(slow)
    assert steps_of("job") == {}
    assert claim.step_with("quick", timeout=30)(calls, "in time") == "in time"
    assert steps_of("job") == {"quick": ("in time", 1)}


def test_purge_and_deletion_remove_a_tasks_steps() -> None:
    claim = claim_of("old")
    claim.step("one", Calls(), 1)
    claim.complete("done")
    kept = claim_of("kept")
    kept.step("one", Calls(), 1)
    Task.objects.filter(key="old").update(updated_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    call_command("taskclaim_purge", "--older-than", "1d", stdout=None)
    assert not Task.objects.filter(key="old").exists()
    assert list(Step.objects.values_list("task__key", flat=True)) == ["kept"]
    Task.objects.filter(key="kept").delete()
    assert not Step.objects.exists()


def test_run_once_reaches_its_claim_and_a_second_run_skips_the_stored_steps() -> None:
    calls = Calls()

    def job(fail: bool) -> str:
        claim = current_claim()
        first = claim.step("first", calls, "a")
        if fail:
            raise RuntimeError("crashed after the first step")
        return first + claim.step("second", calls, "b")

    with pytest.raises(RuntimeError):
        run_once("agent:1", job, True)
    assert run_once("agent:1", job, False) == "ab"
    assert calls.count == 2
    assert steps_of("agent:1") == {"first": ("a", 1), "second": ("b", 2)}


def run(coro: Coroutine[Any, Any, T]) -> T:
    async def main() -> T:
        try:
            return await coro
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(main())


def test_astep_awaits_once_and_is_cancelled_at_its_timeout() -> None:
    claim = claim_of("job")
    calls: list[str] = []

    async def model(prompt: str, delay: float = 0.0) -> str:
        calls.append(prompt)
        await asyncio.sleep(delay)
        return prompt.upper()

    async def body() -> tuple[Any, ...]:
        both = await asyncio.gather(claim.astep("a", model, "a"), claim.astep("b", model, "b"))
        again = await claim.astep("a", model, "other")
        with pytest.raises(TimedOut, match="step 'slow' ran past its timeout"):
            await claim.astep_with("slow", timeout=0.05)(model, "slow", 30)

        async def own_timeout() -> None:
            raise TimeoutError("the function's own")

        with pytest.raises(TimeoutError, match="the function's own"):
            await claim.astep_with("own", timeout=30)(own_timeout)
        return (*both, again)

    assert run(body()) == ("A", "B", "A")
    assert calls == ["a", "b", "slow"]
    assert steps_of("job") == {"a": ("A", 1), "b": ("B", 1)}


def test_a_stale_owners_astep_stores_nothing() -> None:
    stale = claim_of("job", owner="w1")
    expire(stale)
    claim_of("job", owner="w2")
    called: list[int] = []

    async def model() -> int:
        called.append(1)
        return 1

    with pytest.raises(StaleClaim):
        run(stale.astep("a", model))
    assert called == [] and steps_of("job") == {}


def test_a_queue_claim_has_steps_too() -> None:
    Task.objects.ensure("queued", queue="default")
    (claim,) = Task.objects.claim_next(queue="default")
    assert claim.step("one", Calls(), 1) == 1
    assert steps_of("queued") == {"one": (1, claim.token)}


def kill_session(using: str) -> None:
    """End ``using``'s database session from another connection, as a server restart would."""
    db = connections[using]
    with db.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()" if db.vendor == "postgresql" else "SELECT CONNECTION_ID()")
        session = cursor.fetchone()[0]
    other = db.get_new_connection(db.get_connection_params())
    try:
        with other.cursor() as cursor:
            if db.vendor == "postgresql":
                cursor.execute("SELECT pg_terminate_backend(%s)", [session])
            else:
                cursor.execute(f"KILL {int(session)}")
    finally:
        other.close()


def test_a_store_that_failed_on_a_database_error_is_stored_by_the_retry_without_calling_again() -> None:
    claim, calls = claim_of("job"), Calls()
    if connections[claim.using].vendor == "sqlite":
        pytest.skip("a SQLite session cannot be ended from another connection")
    claim.step("first", calls, 1)
    with pytest.raises(DbError), transaction.atomic(using=claim.using):
        kill_session(claim.using)
        claim.step("second", calls, "called once")  # the call happens; its store meets the dead session
    assert calls.count == 2 and steps_of("job") == {"first": (1, 1)}
    assert claim.step("second", calls, "called again") == "called once"  # stored now, not called
    assert calls.count == 2 and steps_of("job") == {"first": (1, 1), "second": ("called once", 1)}


def waiting_for_a_lock(using: str) -> bool:
    """Whether a statement of another session waits for a row lock now (PostgreSQL, MariaDB)."""
    with connections[using].cursor() as cursor:
        if connections[using].vendor == "mysql":
            # The step's insert still running: it waits (on its own it takes well under a millisecond).
            cursor.execute("SELECT count(*) FROM information_schema.processlist WHERE id <> CONNECTION_ID() "
                           "AND info LIKE 'INSERT IGNORE INTO django_taskclaim_step%%'")
        else:
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # activity is snapshotted per transaction
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND datname = current_database()")
        return bool(cursor.fetchone()[0])


def test_a_store_racing_a_takeover_waits_for_it_and_stores_nothing() -> None:
    """The stale owner's store is sent while a takeover's claim is written and not yet committed: it
    waits for the task row (a share lock) and then reads the row the takeover committed, so it
    stores nothing. A snapshot read (READ COMMITTED's INSERT … SELECT) would see the old token."""
    stale, calls = claim_of("job", owner="w1"), Calls()
    if connections[stale.using].vendor == "sqlite":
        pytest.skip("SQLite has one writer: the store waits for the takeover's commit by its busy timeout")
    stale.step("first", calls, 1)  # the stored steps are read: the next store is one insert
    expire(stale)
    taken, go, seen = threading.Event(), threading.Event(), {}

    def takeover() -> None:
        try:
            with transaction.atomic(using=stale.using):
                seen["token"] = claim_of("job", owner="w2").token
                taken.set()
                go.wait(30)
        finally:
            connections.close_all()

    def store() -> None:
        try:
            stale.step("second", calls, "stale")
        except StaleClaim:
            seen["refused"] = True
        finally:
            connections.close_all()

    threads = [threading.Thread(target=takeover, daemon=True), threading.Thread(target=store, daemon=True)]
    threads[0].start()
    assert taken.wait(30), "the takeover did not claim"
    threads[1].start()
    deadline = time.monotonic() + 30
    try:
        while not waiting_for_a_lock(stale.using):
            assert time.monotonic() < deadline, "the stale store did not wait for the takeover's row lock"
            assert threads[1].is_alive(), f"the stale store did not wait: {seen}"
            time.sleep(0.02)
    finally:
        go.set()
        for thread in threads:
            thread.join(30)
    assert seen == {"token": 2, "refused": True}
    assert calls.count == 2 and steps_of("job") == {"first": (1, 1)}
