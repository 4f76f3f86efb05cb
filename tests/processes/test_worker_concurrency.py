"""``work(..., concurrency=N)`` and ``taskclaim_worker --concurrency N``: several tasks in flight in
one process, sync ones on threads (each its own connection), async ones on one event loop."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from collections import Counter

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections

from devtools.polling import wait_until
from devtools.threads import call_in_thread
from django_taskclaim.exceptions import InvalidArgument
from django_taskclaim.models import Attempt, Task
from django_taskclaim.worker import WorkerStats, work
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def queue(n: int, prefix: str = "c") -> list[str]:
    keys = [f"{prefix}{i:03d}" for i in range(n)]
    for i, key in enumerate(keys):
        Task.objects.ensure(key, payload={"n": i}, queue="default")
    return keys


class InFlight:
    """Counts the handlers running at once (the most ever seen, and by which threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.threads: set[int] = set()
        self.sessions: set[object] = set()

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.threads.add(threading.get_ident())

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


def test_sync_tasks_run_n_at_once_each_on_a_thread_and_connection_of_its_own() -> None:
    keys = queue(8)
    seen, meet = InFlight(), threading.Barrier(4, timeout=20)

    def handler(claim):  # type: ignore[no-untyped-def]
        seen.enter()
        connection.ensure_connection()
        with seen.lock:
            seen.sessions.add(id(connection.connection))
        meet.wait()  # passes only when four handlers run at once
        Effect.objects.create(task_key=claim.key, token=claim.token, worker="pool")
        seen.leave()
        return claim.key

    def drain() -> WorkerStats:
        try:
            return work(handler, owner="pool", concurrency=4, until_drained=True, poll=0.05)
        finally:
            connections.close_all()  # the claimer's (this thread's)

    # A pool that counts a slot more than it has never finds itself idle (free() == concurrency), and
    # would poll for ever: fail in a minute, naming why, not at the run's 600 s limit.
    stats = call_in_thread(drain, timeout=60, what="the worker to drain 8 tasks and find all 4 of its slots free")
    assert stats.succeeded == 8 and stats.handled == 8
    assert seen.most == 4 and len(seen.threads) == 4 and len(seen.sessions) == 4
    assert Counter(Effect.objects.values_list("task_key", flat=True)) == dict.fromkeys(keys, 1)
    assert {t.key: (t.status, t.attempts, t.result) for t in Task.objects.all()} == {
        key: (Task.Status.SUCCEEDED, 1, key) for key in keys}
    # Each started once, by its own claim: one attempt row each, succeeded.
    assert Counter(Attempt.objects.values_list("outcome", flat=True)) == {"succeeded": 8}


def test_async_handlers_run_n_at_once_on_one_event_loop() -> None:
    keys = queue(6, prefix="a")
    seen = InFlight()
    together: dict[str, asyncio.Event] = {}

    async def handler(claim):  # type: ignore[no-untyped-def]
        seen.enter()
        group = "first" if claim.key < "a003" else "second"
        event = together.setdefault(group, asyncio.Event())
        if seen.now == 3:
            event.set()
        await asyncio.wait_for(event.wait(), 20)  # three coroutines in flight at once
        seen.leave()
        await claim.acheck()
        return {"key": claim.key, "loop": id(asyncio.get_running_loop())}

    stats = work(handler, owner="loop", concurrency=3, batch=3, until_drained=True, poll=0.05)
    assert stats.succeeded == 6
    assert seen.most == 3 and len(seen.threads) == 1  # one thread: the pool's event loop
    results = {t.key: t.result for t in Task.objects.all()}
    assert {r["key"] for r in results.values()} == set(keys)
    assert len({r["loop"] for r in results.values()}) == 1


def test_a_pool_of_n_slots_has_n_free_and_takes_n_tasks_no_more() -> None:
    """Issue 40, item 21: ``concurrency=N`` is N slots, not one more: N free when idle, none once N
    tasks are in flight, N again when they returned (a slot too many failed only by a 600 s hang)."""
    from django_taskclaim.worker_pool import Pool

    release = threading.Event()
    entered: list[int] = []

    def run(item: int) -> None:
        entered.append(item)
        release.wait(20)

    pool = Pool(3, run=run, arun=lambda item: asyncio.sleep(0), is_async=lambda item: False)
    assert pool.free() == 3
    for item in range(3):
        pool.submit(item)
    assert pool.free() == 0
    wait_until(lambda: len(entered) == 3, timeout=20, what="three tasks in flight")
    release.set()
    pool.wait_idle()
    assert pool.free() == 3
    pool.close()


def test_an_async_handler_runs_one_at_a_time_too() -> None:
    """``concurrency=1`` awaits a coroutine handler (rather than storing the coroutine)."""
    queue(2, prefix="one")

    async def handler(claim):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        return claim.key

    stats = work(handler, owner="one", until_drained=True, poll=0.05)
    assert stats.succeeded == 2
    assert set(Task.objects.values_list("result", flat=True)) == {"one000", "one001"}


def test_stopping_lets_the_tasks_in_flight_finish_and_claims_nothing_more() -> None:
    queue(10, prefix="s")
    stop, ran = threading.Event(), []
    meet = threading.Barrier(2, timeout=20)

    def handler(claim):  # type: ignore[no-untyped-def]
        meet.wait()
        stop.set()  # while both slots are busy: each finishes, nothing more is claimed
        ran.append(claim.key)
        return "done"

    stats = work(handler, owner="stopper", concurrency=2, batch=2, stop=stop)
    assert stats.succeeded == 2 and sorted(ran) == ["s000", "s001"]
    untouched = Task.objects.exclude(key__in=ran)
    assert set(untouched.values_list("status", "attempts", "owner")) == {(Task.Status.PENDING, 0, "")}


def test_batch_caps_each_claim_and_max_tasks_the_total() -> None:
    queue(9, prefix="m")
    stats = work(lambda claim: claim.key, owner="capped", concurrency=4, batch=2, max_tasks=5)
    assert stats.succeeded == 5
    assert Task.objects.filter(status=Task.Status.SUCCEEDED).count() == 5
    assert set(Task.objects.exclude(status=Task.Status.SUCCEEDED).values_list("status", "attempts")) == {
        (Task.Status.PENDING, 0)}


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "4"])
def test_a_bad_concurrency_is_refused_naming_it(value: object) -> None:
    with pytest.raises(InvalidArgument, match="concurrency"):
        work(lambda claim: None, concurrency=value)  # type: ignore[arg-type]


def test_the_command_runs_handlers_with_concurrency_and_refuses_a_bad_one() -> None:
    queue(4, prefix="cmd")
    out = io.StringIO()
    call_command("taskclaim_worker", "tests.programs.worker_handlers.kills_itself_or_counts", "--concurrency", "3",
                 "--until-drained", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {"succeeded": 4, "failed": 0, "fenced_off": 0, "unrecorded": 0}
    with pytest.raises(CommandError, match="concurrency"):
        call_command("taskclaim_worker", "tests.programs.worker_handlers.effect", "--concurrency", "0")


def test_the_command_runs_django_tasks_sync_and_async_with_concurrency() -> None:
    from tests.testapp.tasks import add, add_async

    results = [add.enqueue(1, 2), add_async.enqueue(3, 4), add.enqueue(5, 6), add_async.enqueue(7, 8)]
    out = io.StringIO()
    call_command("taskclaim_worker", "--concurrency", "4", "--until-drained", "--json", stdout=out)
    assert json.loads(out.getvalue())["succeeded"] == 4
    for result in results:
        result.refresh()
    assert [r.return_value for r in results] == [3, 7, 11, 15]


def test_a_slot_given_a_reserved_claim_after_the_stop_releases_it_uncharged() -> None:
    """The claimer hands a slot a reserved claim, then the worker is stopped before the slot starts
    it: it is given back, its attempt count unchanged, and never run."""
    import threading as _threading

    from django_taskclaim.worker import HandlerRunner, _Budget, _Job, _slot

    queue(2, prefix="r")
    first, second = Task.objects.claim_next(owner="w", limit=2, reserve=True)
    assert second.reserved
    ran: list[str] = []
    job = _Job(runner=HandlerRunner(lambda claim: ran.append(claim.key)), owner="w", lease=30, tenant=None,
               queues=["default"], batch=2, wait=0.1, until_drained=False, stop=_threading.Event(),
               budget=_Budget(None), concurrency=2)
    job.stop.set()
    _slot(job, second)
    assert ran == []
    row = Task.objects.get(pk=second.task_id)
    assert (row.status, row.attempts, row.owner) == (Task.Status.PENDING, 0, "")
    _slot(job, first)  # started by its claim: in flight already, it runs to its end
    assert ran == ["r000"] and Task.objects.get(pk=first.task_id).status == Task.Status.SUCCEEDED


@pytest.mark.parametrize(("kind", "lease"), [("sync", None), ("async", None), ("sync", 1.0)])
def test_a_finishing_slot_starts_its_next_task_in_its_own_completion(kind: str, lease: float | None,  # type: ignore[no-untyped-def]
                                                                     monkeypatch) -> None:
    """A slot whose task ends takes a spare claim the claimer holds ready and starts it in the
    commit of that ending. Without spares every task costs a statement besides its completion (a
    claim that starts it, or a start of its own: ``k`` tasks claimed together cost one claim and
    ``k - 1`` starts), ``n`` in all; with them, a task started by the completion before it costs
    none. Each still runs once, one attempt. A lease under the 5 s reservation too (its spares
    reserved for the lease only)."""
    from django_taskclaim import worker
    from django_taskclaim.lifecycle import transitions

    n = 120
    keys = queue(n, prefix=f"n{kind[0]}")
    sent: list[str] = []
    claim_next, start = worker.claim_next, transitions.start
    monkeypatch.setattr(worker, "claim_next", lambda *a, **k: sent.append("claim") or claim_next(*a, **k))
    monkeypatch.setattr(transitions, "start", lambda *a: sent.append("start") or start(*a))

    def handler(claim):  # type: ignore[no-untyped-def]
        time.sleep(0.02)  # long enough for the claimer to hold spares ready
        return claim.key

    async def ahandler(claim):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.02)
        return claim.key

    stats = work(handler if kind == "sync" else ahandler, owner="chain", concurrency=8, until_drained=True,
                 poll=0.05, lease=lease)
    assert stats.succeeded == n
    assert {t.key: (t.status, t.attempts, t.result) for t in Task.objects.all()} == {
        key: (Task.Status.SUCCEEDED, 1, key) for key in keys}
    assert len(sent) < 0.8 * n, f"{len(sent)} claims and starts for {n} tasks: {Counter(sent)}"


def test_a_stopped_pool_leaves_nothing_held_its_spares_given_back_uncharged() -> None:
    queue(60, prefix="h")
    stop, done = threading.Event(), []

    def handler(claim):  # type: ignore[no-untyped-def]
        time.sleep(0.005)
        done.append(claim.key)
        if len(done) == 20:
            stop.set()
        return claim.key

    stats = work(handler, owner="held", concurrency=4, stop=stop, poll=0.05)
    assert stats.succeeded == len(done) >= 20
    rows = set(Task.objects.exclude(key__in=done).values_list("status", "attempts", "owner"))
    assert rows <= {(Task.Status.PENDING, 0, "")}
    assert Task.objects.filter(key__in=done, status=Task.Status.SUCCEEDED, attempts=1).count() == len(done)


def test_spares_held_past_half_their_reservation_are_given_back_uncharged() -> None:
    from django_taskclaim.worker import _Budget, _fresh, _release_spares
    from django_taskclaim.worker_pool import Spares

    queue(3, prefix="sp")
    claims = Task.objects.claim_next(owner="w", limit=3, reserve=True)
    spares, budget = Spares(4, lambda: None), _Budget(10)
    spares.put(claims[1:])
    claims[1]._deadline = time.monotonic() + 1  # held long: less than half its reservation left
    _release_spares(spares, budget, keep=_fresh)
    assert spares.give(4) == [claims[2]] and budget.left == 11
    row = Task.objects.get(pk=claims[1].task_id)
    assert (row.status, row.attempts, row.owner) == (Task.Status.PENDING, 0, "")


def test_a_spare_is_held_at_most_half_its_reservation_however_long_the_claimer_waits() -> None:
    """Issue 40, item 15: a spare is held at most half its reservation (2.5 s at a 30 s lease), even
    by a claimer whose poll interval (10 s) is longer and whose slots hold long tasks: it wakes when
    its first spare turns stale, not only when a slot frees or its poll runs out (a spare was held
    5.8 s). Released uncharged."""
    from django_taskclaim.lifecycle.claim import RESERVATION

    Task.objects.ensure("long0", queue="default", priority=30)
    Task.objects.ensure("quick", queue="default", priority=20)  # its completion makes a slot want a spare
    for key in ("long1", "long2"):  # the slot it frees takes long1; long2 is held as its spare
        Task.objects.ensure(key, queue="default")
    gate, stop, ran = threading.Event(), threading.Event(), []

    def handler(claim):  # type: ignore[no-untyped-def]
        ran.append(claim.key)
        if claim.key.startswith("long"):
            gate.wait(60)  # holds its slot until the test is done
        return claim.key

    def serve() -> None:
        try:
            work(handler, owner="holder", concurrency=2, stop=stop, poll=10, lease=30)
        finally:
            connections.close_all()  # this thread's (the claimer's)

    worker = threading.Thread(target=serve, daemon=True)
    # Claimed, not run: reserved (or started by its claim, when it was claimed while no slot was free).
    spare = Task.objects.filter(key="long2", status=Task.Status.RUNNING)
    worker.start()
    try:
        wait_until(lambda: spare.exists() and len(ran) == 3, timeout=30, interval=0.01, what="long2 held as a spare")
        held_since = time.monotonic()
        wait_until(lambda: not spare.exists(), timeout=30, interval=0.01, what="the spare to be released")
        held = time.monotonic() - held_since
    finally:
        stop.set()
        gate.set()
        worker.join(60)
    assert held < RESERVATION / 2 + 1, f"a spare held {held:.1f} s"  # before: until the 10 s poll ran out
    assert "long2" not in ran
    row = Task.objects.get(key="long2")
    assert (row.status, row.attempts, row.owner) == (Task.Status.PENDING, 0, "")
    assert set(Task.objects.filter(key__in=["long0", "long1"]).values_list("attempts", flat=True)) == {1}


def test_no_body_starts_after_the_stop_not_even_a_spare_a_completion_would_start() -> None:
    """Issue 40, item 21: once the worker is stopped (SIGTERM sets this event), a slot whose task
    completes takes no spare: nothing more starts; the spare held is given back uncharged."""
    Task.objects.ensure("stopper", queue="default", priority=30)
    Task.objects.ensure("quick", queue="default", priority=20)  # its completion makes its slot want a spare
    for key in ("next", "spare"):  # the slot it frees takes "next"; "spare" is held as its spare
        Task.objects.ensure(key, queue="default")
    stop, ran, after_stop = threading.Event(), [], []
    held = Task.objects.filter(key="spare", status=Task.Status.RUNNING)

    def handler(claim):  # type: ignore[no-untyped-def]
        if stop.is_set():
            after_stop.append(claim.key)
        ran.append(claim.key)
        if claim.key == "stopper":  # the stop comes while a spare is held, then this task completes
            wait_until(lambda: "next" in ran and held.exists(), timeout=30, interval=0.01, what="a spare held")
            stop.set()
        elif claim.key == "next":
            wait_until(stop.is_set, timeout=30, interval=0.01, what="the stop")
        return claim.key

    stats = work(handler, owner="stopped", concurrency=2, stop=stop, poll=0.05, lease=30)
    assert after_stop == [] and sorted(ran) == ["next", "quick", "stopper"]
    assert stats.succeeded == 3
    row = Task.objects.get(key="spare")
    assert (row.status, row.attempts, row.owner) == (Task.Status.PENDING, 0, "")


def test_a_spare_of_a_short_lease_is_fresh_by_its_own_reservation() -> None:
    """A lease under the 5 s reservation reserves for the lease only: half of that, not of 5 s, is
    when its spare has waited too long (else every spare of a 1 s lease went back at once)."""
    from django_taskclaim.worker import _fresh

    queue(2, prefix="sl")
    _, spare = Task.objects.claim_next(owner="w", lease=1, limit=2, reserve=True)
    assert spare.reserved and _fresh(spare)
    spare._deadline = time.monotonic() + 0.4  # less than half of its 1 s reservation left
    assert not _fresh(spare)


def test_spares_are_asked_for_by_demand_only() -> None:
    from django_taskclaim.worker_pool import Spares

    nudges: list[int] = []
    spares = Spares(4, lambda: nudges.append(1))
    assert spares.wanted() == 0  # nobody took one yet: a pool of long tasks holds none
    assert spares.take() is None and nudges == []  # none taken: the slot frees, which wakes the claimer
    assert spares.wanted() == 1  # as many as were taken in the last second
    spares.put(["a"])
    assert spares.take() == "a" and spares.take() is None and spares.take() is None
    assert spares.wanted() == 4
    spares.put(["b", "c"])
    assert spares.take() == "b" and len(nudges) == 2 and spares.wanted() == 3  # four of the last second
    shifted = [at - Spares.WINDOW for at in spares.taken]
    spares.taken.clear()
    spares.taken.extend(shifted)
    assert spares.wanted() == 0  # none taken in the last second: what is held is enough
