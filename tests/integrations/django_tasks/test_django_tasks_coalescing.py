"""``@coalesced``: enqueues of one group while its task waits are that task (newest arguments, a
"not before" time moved by ``delay`` and capped by ``max_delay``); while it runs, one follow-up;
after it ended, a new task. Bad input is refused before anything is stored. Races between real
processes: tests/processes/test_coalescing_processes.py."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.polling import wait_until
from django_taskclaim import TaskKey
from django_taskclaim.exceptions import InvalidArgument
from django_taskclaim.models import CoalesceGroup, Task
from django_taskclaim.tasks import coalesced, keyed
from django_taskclaim.tasks.coalescing import MAX_GROUP_LENGTH
from django_taskclaim.tasks.results import result_id
from django_taskclaim.tasks.runner import TaskRunner
from django_taskclaim.worker import work
from tests.testapp import coalesced_tasks as ct

pytestmark = pytest.mark.django_db(transaction=True)
PATH = "tests.testapp.coalesced_tasks."


def rows(name: str) -> list[Task]:
    return list(Task.objects.for_tenant("").filter(task_path=PATH + name).order_by("id"))


def groups() -> Any:
    """The coalescing groups, in the database of tenant "" (that of every Django task's group)."""
    return CoalesceGroup.objects.using(Task.objects.for_tenant("").db)


def claim_one() -> Any:
    [claim] = Task.objects.for_tenant("").claim_next(owner="worker", queue="default", path="*")
    return claim


def test_enqueues_while_it_waits_are_one_task_and_the_newest_arguments_win() -> None:
    first = ct.reindex.enqueue(7, version=1)
    second = ct.reindex.enqueue(7, version=2)
    third = ct.reindex.enqueue(doc_id=7, version=3)
    other = ct.reindex.enqueue(8, version=1)  # another group: its own task
    assert first.id == second.id == third.id != other.id
    [row, _] = rows("reindex")
    assert row.status == Task.Status.PENDING and row.payload == {"args": [], "kwargs": {"doc_id": 7, "version": 3}}
    assert ct.reindex.get_result(first.id).kwargs == {"doc_id": 7, "version": 3}
    assert second.args == [7] and second.kwargs == {"version": 2}  # each caller's result, as it stood then
    work(TaskRunner("default"), owner="tester", queue="default", until_drained=True, poll=0.02)
    assert ct.reindex.get_result(first.id).return_value == {"doc": 7, "version": 3, "token": 1}
    assert Task.objects.for_tenant("").get(pk=row.pk).attempts == 1


def test_while_it_runs_one_follow_up_is_queued_never_two_and_after_it_a_new_task() -> None:
    running = ct.reindex.enqueue(1, version="a")
    claim = claim_one()
    follow_ups = [ct.reindex.enqueue(1, version=v) for v in ("b", "c", "d")]
    assert {r.id for r in follow_ups} == {follow_ups[0].id} and follow_ups[0].id != running.id
    [was_running, follow_up] = rows("reindex")
    assert (was_running.status, follow_up.status) == (Task.Status.RUNNING, Task.Status.PENDING)
    assert follow_up.payload["kwargs"] == {"version": "d"}
    claim.complete({"done": "a"})
    # The follow-up waits still: it takes the next enqueue too.
    assert ct.reindex.enqueue(1, version="e").id == follow_ups[0].id
    claim_one().complete("e")
    after = ct.reindex.enqueue(1, version="f")  # every task of the group ended: new work
    assert after.id not in (running.id, follow_ups[0].id)
    assert [r.status for r in rows("reindex")] == [Task.Status.SUCCEEDED, Task.Status.SUCCEEDED, Task.Status.PENDING]


def test_a_failed_attempt_retried_is_its_own_task_and_the_follow_up_stays_one() -> None:
    ct.reindex.enqueue(2, version=1)
    claim = claim_one()
    follow_up = ct.reindex.enqueue(2, version=2)
    claim.fail("boom", retry=True)  # back to PENDING: a started task, not the group's waiting one
    assert ct.reindex.enqueue(2, version=3).id == follow_up.id
    assert [r.status for r in rows("reindex")] == [Task.Status.PENDING, Task.Status.PENDING]


def test_a_task_given_back_before_it_started_still_collapses() -> None:
    # Issue 40, item 3: a claim released untouched (by its owner, or a batch worker's reservation
    # given back on SIGTERM, a spare, an import grace) raised the token but never started the task:
    # it still waits, and the next enqueue is it, with the newest arguments.
    ahead = ct.reindex.enqueue(30)  # a batch starts its first claim and reserves the others
    first = ct.reindex.enqueue(3, version=1)
    [started, reserved] = Task.objects.for_tenant("").claim_next(owner="batch", queue="default", path="*",
                                                                 limit=2, reserve=True)
    assert started.key != reserved.key and reserved.reserved
    reserved.release()
    started.complete(None)
    assert ct.reindex.enqueue(3, version=2).id == first.id
    claim_one().release()
    [_, row] = rows("reindex")
    assert (row.status, row.attempts, row.fencing_token > 1) == (Task.Status.PENDING, 0, True)
    assert ct.reindex.enqueue(3, version=3).id == first.id
    work(TaskRunner("default"), owner="tester", queue="default", until_drained=True, poll=0.02)
    [_, done] = rows("reindex")
    assert (done.status, done.payload["kwargs"]) == (Task.Status.SUCCEEDED, {"version": 3})
    assert ct.reindex.get_result(ahead.id).status == "SUCCESSFUL"


def test_a_task_retried_after_it_started_never_takes_a_later_enqueue() -> None:
    # The other side of the rule (it fails if the collapse's guard is dropped): a task whose attempt
    # counted is pending again after a failure with its own arguments; the next enqueue is new work.
    retried = ct.reindex.enqueue(4, version=1)
    claim_one().fail("boom", retry=True)
    assert ct.reindex.enqueue(4, version=2).id != retried.id
    assert [r.payload["kwargs"] for r in rows("reindex")] == [{"version": 1}, {"version": 2}]


def test_a_task_taken_back_from_a_lost_worker_never_takes_a_later_enqueue() -> None:
    # Its body may have run (the worker's lease expired): pending again, its attempt counted.
    expired = ct.reindex.enqueue(5, version=1)
    Task.objects.for_tenant("").claim_next(owner="lost", queue="default", path="*", lease=0.2)
    wait_until(lambda: Task.objects.reclaim_expired(), timeout=30, what="the lost worker's lease to expire")
    assert ct.reindex.enqueue(5, version=2).id != expired.id
    assert [(r.attempts, r.payload["kwargs"]) for r in rows("reindex")] == [(1, {"version": 1}), (0, {"version": 2})]


def test_a_concurrency_limit_runs_a_group_one_at_a_time() -> None:
    # Issue 40, item 14: @coalesced with @claim_options(concurrency_limit=1), as the docs advise,
    # was ignored (the follow-up had no limit): the runs overlapped. Each task of the group now
    # carries the key and limit of its arguments, new or collapsed into.
    first = ct.serial_reindex.enqueue(1, version="a")
    claim = claim_one()
    follow_up = ct.serial_reindex.enqueue(1, version="b")
    assert ct.serial_reindex.enqueue(1, version="c").id == follow_up.id != first.id
    other = ct.serial_reindex.enqueue(2, version="x")  # another document: its own key
    assert [(r.concurrency_key, r.concurrency_limit) for r in rows("serial_reindex")] == [
        ("serial:1", 1), ("serial:1", 1), ("serial:2", 1)]
    # While the first runs, a claim of five takes the other document's task, not the follow-up.
    [running_beside] = Task.objects.for_tenant("").claim_next(owner="w2", queue="default", path="*", limit=5)
    assert running_beside.key == rows("serial_reindex")[2].key
    assert ct.serial_reindex.get_result(other.id).status == "RUNNING"
    assert [r.status for r in rows("serial_reindex")] == [Task.Status.RUNNING, Task.Status.PENDING,
                                                          Task.Status.RUNNING]
    claim.complete("a")
    running_beside.complete("x")
    work(TaskRunner("default"), owner="tester", queue="default", until_drained=True, poll=0.02)
    assert ct.serial_reindex.get_result(follow_up.id).return_value == "c"


def test_delay_moves_the_not_before_time_with_each_enqueue_up_to_max_delay() -> None:
    thirty = dt.timedelta(seconds=30)
    ct.debounced.enqueue(1, version=1)
    [row] = rows("debounced")
    assert row.run_after == row.created_at + thirty  # by the database clock: 30 s after the enqueue
    ct.debounced.enqueue(1, version=2)
    [again] = rows("debounced")
    assert row.run_after <= again.run_after <= row.created_at + 2 * thirty  # moved, never past max_delay
    assert again.payload["kwargs"] == {"version": 2} and again.created_at == row.created_at
    # max_delay caps it: capped's delay equals its max_delay, so a later enqueue cannot move it.
    ct.capped.enqueue(5)
    [capped] = rows("capped")
    ct.capped.enqueue(5)
    [still] = rows("capped")
    assert still.run_after == capped.run_after == capped.created_at + thirty


def test_task_enqueued_is_sent_for_a_new_task_only() -> None:
    from django_taskclaim.tasks.compat import task_enqueued

    heard: list[str] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        heard.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        first = ct.reindex.enqueue(4, version=1)
        ct.reindex.enqueue(4, version=2)
    finally:
        task_enqueued.disconnect(receiver)
    assert heard == [first.id]


def test_an_enqueue_rolled_back_with_the_callers_transaction_leaves_nothing() -> None:
    # The transaction of the task database (the caller's own where the tasks are in its database).
    with pytest.raises(RuntimeError), transaction.atomic(using=Task.objects.for_tenant("").db):
        ct.reindex.enqueue(3)
        raise RuntimeError("the caller's transaction rolls back")
    assert rows("reindex") == [] and not groups().exists()


# -- bad input ---------------------------------------------------------------------------------
_BAD_GROUPS = st.one_of(
    st.just(""),
    st.text(min_size=MAX_GROUP_LENGTH + 1, max_size=MAX_GROUP_LENGTH + 20, alphabet="ab"),
    st.integers(), st.none(), st.lists(st.integers(), max_size=2), st.booleans(),
    st.text(min_size=1, max_size=5).map(lambda s: s + "\x00"),
    st.text(min_size=0, max_size=5).map(lambda s: s + "\n"),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_BAD_GROUPS)
def test_a_group_that_is_not_a_short_printable_string_is_refused_naming_the_task_and_nothing_is_stored(
        value: Any) -> None:
    with pytest.raises(InvalidArgument, match=r"grouped_by_value.*group") as caught:
        ct.grouped_by_value.enqueue(value)
    assert "coalesced" in str(caught.value)
    assert not Task.objects.for_tenant("").exists() and not groups().exists()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e), min_size=1,
                     max_size=MAX_GROUP_LENGTH))
def test_any_short_printable_group_is_one_task(value: str) -> None:
    first, second = ct.grouped_by_value.enqueue(value), ct.grouped_by_value.enqueue(value)
    assert first.id == second.id
    assert result_id(Task.objects.for_tenant("").get(pk=groups().get(name=value).task_id)) == first.id
    Task.objects.for_tenant("").all().delete()
    groups().all().delete()


_NUMBERS = st.one_of(st.integers(min_value=-10**6, max_value=10**6),
                     st.floats(allow_nan=True, allow_infinity=True), st.none(), st.booleans(), st.text(max_size=3))


def _valid(delay: Any, max_delay: Any) -> bool:
    def seconds(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 30 * 86400
    return seconds(delay) and (max_delay is None or (seconds(max_delay) and max_delay >= delay))


@settings(max_examples=200, deadline=None)
@given(delay=_NUMBERS, max_delay=_NUMBERS)
def test_delay_and_max_delay_are_checked_when_the_task_is_declared(delay: Any, max_delay: Any) -> None:
    def func(x: int) -> int:
        return x

    if _valid(delay, max_delay):
        assert coalesced(lambda x: "g", delay=delay, max_delay=max_delay)(func) is func
    else:
        with pytest.raises(InvalidArgument, match="delay"):
            coalesced(lambda x: "g", delay=delay, max_delay=max_delay)(func)


def test_max_delay_below_delay_and_timedeltas() -> None:
    with pytest.raises(InvalidArgument, match=r"max_delay \(5 s\) is shorter than delay \(10 s\)"):
        coalesced(lambda: "g", delay=10, max_delay=5)
    def func() -> None: ...
    assert coalesced(lambda: "g", delay=dt.timedelta(seconds=2), max_delay=dt.timedelta(minutes=1))(func) is func


def test_keyed_and_coalesced_on_one_task_are_refused_in_either_order() -> None:
    def func(n: int) -> int:
        return n

    with pytest.raises(TypeError, match="both @keyed and @coalesced"):
        keyed(lambda n: TaskKey("k", run=str(n)))(coalesced(lambda n: "g")(func))

    def other(n: int) -> int:
        return n

    with pytest.raises(TypeError, match="both @keyed and @coalesced"):
        coalesced(lambda n: "g")(keyed(lambda n: TaskKey("k", run=str(n)))(other))


def test_group_must_be_callable_and_go_under_task() -> None:
    with pytest.raises(TypeError, match="callable"):
        coalesced("reindex")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="under @task"):
        coalesced(lambda n: "g")(ct.reindex)


def test_a_run_after_is_refused_for_a_coalesced_task() -> None:
    later = ct.reindex.using(run_after=timezone.now() + dt.timedelta(minutes=5))
    with pytest.raises(InvalidArgument, match="run_after"):
        later.enqueue(1)
    assert not Task.objects.for_tenant("").exists()


def test_groups_compare_exactly() -> None:
    # MySQL/MariaDB's default collations would make these one group (migration 0005 makes them exact).
    ids = {ct.grouped_by_value.enqueue(value).id for value in ("doc:A", "doc:a", "doc:a ", "doc:á")}
    assert len(ids) == 4


def test_aenqueue_and_enqueue_many_coalesce_as_enqueue_does() -> None:
    from asgiref.sync import async_to_sync

    from django_taskclaim.tasks import enqueue_many

    first = async_to_sync(ct.reindex.aenqueue)(9, version=1)
    assert async_to_sync(ct.reindex.aenqueue)(9, version=2).id == first.id
    results = enqueue_many(ct.reindex, [((9,), {"version": 3}), ((10,), {}), ((9,), {"version": 4})])
    assert [r.id for r in results] == [first.id, results[1].id, first.id] and results[1].id != first.id
    assert [r.payload["kwargs"] for r in rows("reindex")] == [{"version": 4}, {}]


@pytest.mark.django_db(transaction=True, databases="__all__")
def test_coalesce_task_groups_are_per_tenant_in_the_tenants_database() -> None:
    from django_taskclaim.claims import coalesce_task
    from tests.routers import TenantHash, tenants_on

    tenants = [tenants_on(alias, 1, "coal-")[0] for alias in TenantHash.databases]  # one per shard where sharded
    made = {tenant: coalesce_task("g", tenant, {"n": 1}, queue="default", task_path="") for tenant in tenants}
    for tenant, (task, created) in made.items():
        assert created and task._state.db == Task.objects.for_tenant(tenant).db
        again, created = coalesce_task("g", tenant, {"n": 2}, queue="default", task_path="")
        assert (again.pk, again._state.db, again.payload, created) == (task.pk, task._state.db, {"n": 2}, False)
    with pytest.raises(InvalidArgument, match=r"max_delay \(1 s\) is shorter than delay \(2 s\)"):
        coalesce_task("g", "", queue="default", task_path="", delay=2, max_delay=1)
