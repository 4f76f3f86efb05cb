"""The database threads of a worker's event loop (issue 32, item 8; issue 40, item 5): the ORM calls
of its async tasks (claim start, completion, their bodies' own) run each task's on a thread of its
own, with its own connection, not all on one: one task's slow query never holds up another's calls
(nor its deadline); the connections bounded by the concurrency and closed when the worker ends;
and the default batch sized from the concurrency."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.db.backends.signals import connection_created

from devtools.polling import wait_until
from django_taskclaim import db_threads, wakeups
from django_taskclaim.models import Attempt, Task
from django_taskclaim.worker import default_batch, work
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

CONCURRENCY = 16


def sessions() -> int:
    """The sessions the server has open on the test database now (from the test's own connection)."""
    sql = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
           if connection.vendor == "postgresql" else
           "SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE()")
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return int(cursor.fetchone()[0])


class Opened:
    """The connections opened while it listens, by the name of the thread that opened each."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_thread: list[tuple[str, Any]] = []

    def __call__(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        with self.lock:
            self.by_thread.append((threading.current_thread().name, connection))

    def on_db_threads(self) -> list[Any]:
        return [conn for name, conn in self.by_thread if name.startswith("taskclaim-async-db-")]


@pytest.fixture
def opened() -> Any:
    listener = Opened()
    connection_created.connect(listener)
    yield listener
    connection_created.disconnect(listener)


@pytest.mark.parametrize("executor_contexts", [True, False], ids=["asgiref-executor", "asgiref-legacy"])
def test_async_tasks_orm_calls_spread_over_database_threads_each_task_on_one(
        executor_contexts: bool, opened: Opened, monkeypatch: Any) -> None:
    if executor_contexts and not db_threads.EXECUTOR_CONTEXTS:
        pytest.skip("this asgiref has no ThreadSensitiveContext(executor=...)")
    monkeypatch.setattr(db_threads, "EXECUTOR_CONTEXTS", executor_contexts)
    tasks = 3 * CONCURRENCY
    for i in range(tasks):
        Task.objects.ensure(f"d{i:03d}", queue="default")
    lock, in_flight = threading.Lock(), [0]
    all_in: dict[int, asyncio.Event] = {}
    threads: dict[str, set[int]] = {}
    most_sessions = [0]

    async def handler(claim: Any) -> str:
        first = await sync_to_async(threading.get_ident)()
        with lock:
            in_flight[0] += 1
            full = in_flight[0] == CONCURRENCY
        event = all_in.setdefault(id(asyncio.get_running_loop()), asyncio.Event())
        if full:
            event.set()
        if claim.key < f"d{CONCURRENCY:03d}":  # the first round waits until every slot holds a task
            await asyncio.wait_for(event.wait(), 30)
        await asyncio.sleep(0.01)  # the other tasks' calls run meanwhile
        await claim.acheck()  # the claim's own a-method: on the task's database thread too
        if connection.vendor != "sqlite":
            count = await sync_to_async(sessions)()
            with lock:
                most_sessions[0] = max(most_sessions[0], count)
        last = await sync_to_async(threading.get_ident)()
        with lock:
            threads[claim.key] = {first, last}
            in_flight[0] -= 1
        return claim.key

    before = 0
    if connection.vendor != "sqlite":
        # Only this test's own session before the worker starts: an earlier test's children (killed,
        # in random order) may leave sessions the server is still ending, which would count as ours.
        wait_until(lambda: sessions() == 1, timeout=30, what="earlier tests' sessions to end")
        before = 1
    stats = work(handler, owner="lanes", concurrency=CONCURRENCY, until_drained=True, poll=0.05)
    assert stats.succeeded == tasks and stats.handled == tasks
    assert Counter(Attempt.objects.values_list("outcome", flat=True)) == {"succeeded": tasks}
    assert all(len(used) == 1 for used in threads.values()), threads  # each task's calls on one thread
    # A thread per task in flight: as many as the slots, each used again by later tasks.
    expected = CONCURRENCY
    assert len(set().union(*threads.values())) == expected
    # One connection per database thread, each closed when the worker ended.
    lanes = opened.on_db_threads()
    assert len(lanes) == expected
    assert all(conn.connection is None for conn in lanes)
    if connection.vendor != "sqlite":
        # On the server: the worker's sessions stayed within its database threads, the claimer's
        # (this thread's, counted before) and its listener's (PostgreSQL's wake-ups), and all are
        # gone once it returned (this thread's listener once closed: it is kept for the thread).
        assert before < most_sessions[0] <= before + expected + 1
        wakeups.close()
        wait_until(lambda: sessions() == before, timeout=30, what="the worker's sessions to end")


def test_a_task_past_its_timeout_is_cancelled_and_fenced_from_its_database_thread() -> None:
    """A timeout cancels an async task whose ORM calls run on a database thread, and fences it: what
    it writes in ``afenced()`` afterwards is refused; the other tasks on the threads go on."""
    from django_taskclaim.exceptions import StaleClaim

    for i in range(4):
        Task.objects.ensure(f"t{i}", max_attempts=1, queue="default")
    refused: list[str] = []

    async def handler(claim: Any) -> str:
        if claim.key == "t0":
            try:
                await asyncio.sleep(30)  # cancelled by its timeout
            finally:
                try:
                    await claim.afenced(lambda: None)
                except StaleClaim:
                    refused.append(claim.key)
        return claim.key

    stats = work(handler, owner="late", concurrency=CONCURRENCY, until_drained=True, poll=0.05, timeout=0.5)
    assert stats.timed_out == 1 and stats.succeeded == 3
    assert refused == ["t0"]
    row = Task.objects.get(key="t0")
    assert (row.status, row.attempts) == (Task.Status.FAILED, 1)
    assert "TimedOut" in Attempt.objects.get(task=row).error


def test_the_default_batch_is_sized_from_the_concurrency(caplog: Any) -> None:
    assert [default_batch(n) for n in (1, 2, 4, 16, 32, 500)] == [1, 2, 4, 16, 16, 16]
    for i in range(6):
        Task.objects.ensure(f"b{i}", queue="default")
    with caplog.at_level(logging.INFO, logger="django_taskclaim"):
        stats = work(lambda claim: claim.key, owner="sized", concurrency=4, until_drained=True, poll=0.05)
    assert stats.succeeded == 6
    started = [r for r in caplog.records if r.getMessage().startswith("worker 'sized' started")]
    assert [r.batch for r in started] == [4]  # type: ignore[attr-defined]


def test_a_slow_query_of_one_async_task_holds_up_no_other_task(processes: Any) -> None:
    """Issue 40, item 5: in a ``--concurrency 8`` worker process one async task holds a 5 s statement;
    the seven quick ones beside it (0.5 s of work, then their effect and completion in ``afenced()``),
    under a 2 s timeout, all succeed: their ORM calls do not wait behind that statement. Before, the
    eight shared one database thread, and the quick ones timed out, their effects rolled back."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no statement that sleeps")
    Task.objects.ensure("slowquery", queue="default", priority=10, max_attempts=1)  # claimed first
    quick = [f"quick{i}" for i in range(7)]
    for key in quick:
        Task.objects.ensure(key, queue="default", max_attempts=1)  # a timeout is not retried into a success
    worker = processes.start("django", "taskclaim_worker", "tests.programs.worker_handlers.slow_query_or_quick",
                             "--concurrency", "8", "--timeout", "2", "--until-drained", "--json",
                             env={"TASKCLAIM_TEST_QUERY": "5"})
    report = worker.finish(120)
    assert (report["succeeded"], report["timed_out"]) == (7, 1), report  # the slow one alone ran past 2 s
    assert sorted(Effect.objects.values_list("task_key", flat=True)) == quick
    assert set(Task.objects.filter(key__in=quick).values_list("status", flat=True)) == {Task.Status.SUCCEEDED}
    assert Task.objects.get(key="slowquery").status == Task.Status.FAILED


def test_past_its_most_threads_a_task_shares_the_least_used_one() -> None:
    """A loop's async tasks each get a database thread of their own up to ``db_threads.MOST``; past
    it (``--concurrency 500`` would open 500 sessions, past the server's ``max_connections``) a task
    shares the least used thread, and each task's calls still run on one thread."""
    threads = db_threads.DbThreads(most=2)
    seen: dict[int, set[int]] = {}

    async def task(n: int, entered: asyncio.Event, go: asyncio.Event) -> None:
        async with threads.lane():
            seen[n] = {await sync_to_async(threading.get_ident)()}
            entered.set()
            await go.wait()
            seen[n].add(await sync_to_async(threading.get_ident)())

    async def main() -> None:
        go = asyncio.Event()
        entered = [asyncio.Event() for _ in range(5)]
        running = [asyncio.create_task(task(n, entered[n], go)) for n in range(5)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in entered)), 30)
        assert len(threads.threads) == 2  # five tasks in flight, two threads
        go.set()
        await asyncio.gather(*running)

    try:
        asyncio.run(main())
    finally:
        threads.close()
    assert all(len(used) == 1 for used in seen.values()), seen  # each task's calls on one thread
    assert len(set().union(*seen.values())) == 2
    assert db_threads.MOST >= 16  # the worker's default: a thread per task for the usual concurrencies
