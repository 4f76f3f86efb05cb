"""run_once at its edges: argument names, database errors inside transactions, waiting callers,
callers with autocommit off."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import DatabaseError, connection, transaction

from django_taskclaim import run_once, signals
from django_taskclaim.exceptions import TaskBusy
from django_taskclaim.models import Attempt, Task
from django_taskclaim.once import run_once_with
from tests.conftest import MYSQL_LOCK_WAITS
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def echo(*args: object, **kwargs: object) -> dict[str, object]:
    return {"args": list(args), "kwargs": kwargs}


def test_func_keywords_named_key_and_func_reach_func() -> None:
    assert run_once("job", echo, 1, key="k", func="f") == {"args": [1], "kwargs": {"key": "k", "func": "f"}}


def test_run_once_with_passes_every_keyword_to_func() -> None:
    call = run_once_with("job", tenant="acme", lease=5)
    result = call(echo, tenant="t", payload="p", lease="l", on_busy="o", key="k")
    assert result == {"args": [], "kwargs": {"tenant": "t", "payload": "p", "lease": "l", "on_busy": "o", "key": "k"}}
    task = Task.objects.get()
    assert (task.tenant, task.key) == ("acme", "job")
    # The same options and key: a duplicate, answered from the stored result.
    assert run_once_with("job", tenant="acme")(pytest.fail) == result
    with pytest.raises(ValueError, match="on_busy"):
        run_once_with("job", on_busy="later")


def test_a_database_error_in_func_inside_atomic_propagates_as_itself() -> None:
    """On PostgreSQL the error aborts the transaction; without a savepoint fail() would hide it."""
    def write_then_fail() -> None:
        Effect.objects.create(task_key="job", token=1, worker="w")  # rolled back with the savepoint
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")

    with transaction.atomic():
        with pytest.raises(DatabaseError, match="no_such_table") as caught:
            run_once("job", write_then_fail)
        assert "aborted" not in str(caught.value)
        # The transaction is still usable, and the failure was recorded for a retry.
        task = Task.objects.get(key="job")
        assert (task.status, task.attempts) == ("pending", 1) and "no_such_table" in task.error
    assert Task.objects.get(key="job").status == "pending" and not Effect.objects.exists()


def test_each_waiting_caller_leaves_one_duplicate_row(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKCLAIM_POLL_INTERVAL = 0.02
    owner = Task.objects.claim("job", owner="first").claim
    results: list[object] = []

    def waiter() -> None:
        try:
            results.append(run_once("job", lambda: "a waiter ran", on_busy="wait"))
        finally:
            connection.close()

    threads = [threading.Thread(target=waiter) for _ in range(3)]
    for thread in threads:
        thread.start()

    def all_waiting() -> bool:
        return Attempt.objects.filter(outcome="duplicate").count() >= 3

    deadline = time.monotonic() + 30
    while not all_waiting():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    owner.complete("first result")
    for thread in threads:
        thread.join(30)
    assert results == ["first result"] * 3
    assert Attempt.objects.filter(outcome="duplicate").count() == 3


def test_on_busy_raise_is_unchanged() -> None:
    Task.objects.claim("job", owner="first")
    with pytest.raises(TaskBusy):
        run_once("job", pytest.fail)


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_a_duplicate_claim_with_autocommit_off_keeps_synchronous_commit() -> None:
    """The loser's audit row is committed asynchronously only outside any caller transaction."""
    Task.objects.claim("job", owner="first")
    connection.set_autocommit(False)
    try:
        assert not Task.objects.claim("job", owner="second").claimed
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            assert cursor.fetchone()[0] == "on", "the caller's transaction would commit asynchronously"
        connection.commit()
    finally:
        connection.set_autocommit(True)
    assert Attempt.objects.filter(outcome="duplicate", owner="second").count() == 1


def test_signals_with_autocommit_off() -> None:
    """Django's on_commit refuses manual transactions; receivers hear of the change at once."""
    heard: list[str] = []

    def receiver(sender: object, **kwargs: object) -> None:
        heard.append(str(kwargs["owner"]))

    Task.objects.claim("job", owner="first")
    signals.duplicate_delivery.connect(receiver)
    connection.set_autocommit(False)
    try:
        assert not Task.objects.claim("job", owner="second").claimed
        connection.commit()
    finally:
        connection.set_autocommit(True)
        signals.duplicate_delivery.disconnect(receiver)
    assert heard == ["second"]


@pytest.mark.skipif("connection.vendor == 'sqlite'")
def test_inside_a_request_transaction_a_duplicate_waits_then_gets_the_result() -> None:
    """What docs/recipes.md says of ATOMIC_REQUESTS on PostgreSQL (and MySQL): the duplicate blocks
    until the first transaction commits, then returns the stored result without running anything."""
    seen: list[object] = []

    def duplicate() -> None:
        try:
            seen.append(run_once("job", lambda: "the duplicate ran"))
        finally:
            connection.close()

    thread = threading.Thread(target=duplicate)
    with transaction.atomic():
        assert run_once("job", lambda: "first") == "first"
        thread.start()

        def blocked() -> bool:
            with connection.cursor() as cursor:
                if connection.vendor == "mysql":
                    cursor.execute(MYSQL_LOCK_WAITS)
                    return bool(cursor.fetchone()[0])
                cursor.execute("SELECT pg_stat_clear_snapshot()")  # activity is snapshotted per transaction
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                               "AND datname = current_database()")
                return bool(cursor.fetchone()[0])

        deadline = time.monotonic() + 30
        while not blocked():
            assert time.monotonic() < deadline, "the duplicate did not wait for the first transaction"
            time.sleep(0.02)
        assert not seen
    thread.join(30)
    assert seen == ["first"]


def test_each_waiting_async_caller_leaves_one_duplicate_row(settings) -> None:  # type: ignore[no-untyped-def]
    """The same for ``arun_once``: waiters in one event loop, one ``duplicate`` row each."""
    import asyncio

    from asgiref.sync import sync_to_async
    from django.db import connections

    from django_taskclaim import arun_once

    settings.TASKCLAIM_POLL_INTERVAL = 0.02
    owner = Task.objects.claim("job", owner="first").claim

    async def main() -> list[object]:
        async def nothing() -> str:
            return "a waiter ran"

        try:
            waiters = [asyncio.ensure_future(arun_once("job", nothing, on_busy="wait")) for _ in range(3)]
            deadline = time.monotonic() + 30
            while await Attempt.objects.filter(outcome="duplicate").acount() < 3:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            await sync_to_async(owner.complete)("first result")
            return list(await asyncio.gather(*waiters))
        finally:
            await sync_to_async(connections.close_all)()

    assert asyncio.run(main()) == ["first result"] * 3
    assert Attempt.objects.filter(outcome="duplicate").count() == 3
