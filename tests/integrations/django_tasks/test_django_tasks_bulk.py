"""Bulk enqueue: ``ClaimBackend.enqueue_many`` (and ``django_taskclaim.tasks.enqueue_many``) on the
store's multi-row insert (``Store.ensure_many``), on every database the suite runs on."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_taskclaim.claims import ensure_many
from django_taskclaim.exceptions import InvalidTaskKey, PayloadMismatch
from django_taskclaim.models import Task
from django_taskclaim.routing import route
from django_taskclaim.store import get_store
from django_taskclaim.store.rows import NewTask
from django_taskclaim.store.sql import ENSURE_CHUNK
from django_taskclaim.tasks import enqueue_many
from django_taskclaim.tasks.compat import InvalidTask, TaskResultStatus, task_backends, task_enqueued
from django_taskclaim.tasks.runner import TaskRunner
from django_taskclaim.worker import work
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def drain() -> object:
    return work(TaskRunner("default"), owner="tester", queue=["default", "emails"], until_drained=True, poll=0.02)


def rows_per_insert() -> int:
    """How many tasks one multi-row insert takes on this database (its limit on parameters)."""
    limit = connection.features.max_query_params
    return ENSURE_CHUNK if limit is None else min(ENSURE_CHUNK, limit // len(NewTask._fields))


def task_inserts(queries: CaptureQueriesContext) -> int:
    return sum(1 for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("INSERT INTO")
               and "django_taskclaim_task" in q["sql"].split("(")[0])


def row_id(result: object) -> int:
    """The task row's id in a result's id (``"alias:id"`` where tenants are routed to several databases)."""
    return int(str(result.id).rsplit(":", 1)[-1])  # type: ignore[attr-defined]


def test_enqueue_many_returns_what_get_result_reads_in_order_one_insert_per_chunk() -> None:
    n = rows_per_insert() * 2 + 7  # two full chunks and a part
    with CaptureQueriesContext(connection) as queries:
        results = enqueue_many(tasks.add, [((i, 1), {}) for i in range(n)])
    assert task_inserts(queries) == 3
    assert len(results) == n == Task.objects.count()
    assert [r.args for r in results] == [[i, 1] for i in range(n)]
    # Ids follow the calls' order: among equal priorities the queue hands them out so.
    assert [row_id(r) for r in results] == sorted(row_id(r) for r in results)
    backend = task_backends["default"]
    for result in (results[0], results[n // 2], results[-1]):
        assert result.status == TaskResultStatus.READY and result.attempts == 0 and result.errors == []
        assert backend.get_result(result.id) == result
    row = Task.objects.get(pk=row_id(results[0]))
    assert (row.queue, row.priority, row.task_path, row.status) == ("default", 0, "tests.testapp.tasks.add", "pending")
    assert row.dispatch == {"backend": "default"} and row.max_attempts == 5


def test_the_tasks_run_once_each() -> None:
    results = task_backends["default"].enqueue_many(tasks.add, [((i,), {"b": i}) for i in range(25)])
    assert drain().succeeded == 25  # type: ignore[attr-defined]
    for i, result in enumerate(results):
        result.refresh()
        assert (result.status, result.return_value, result.attempts) == (TaskResultStatus.SUCCESSFUL, 2 * i, 1)


def test_the_tasks_routing_is_every_rows() -> None:
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    results = enqueue_many(tasks.send_email.using(priority=-5, run_after=later), [(("a@x",), {}), (("b@x",), {})])
    rows = list(Task.objects.order_by("id").values_list("queue", "priority", "run_after"))
    assert rows == [("emails", -5, later)] * 2
    assert [r.task.run_after for r in results] == [later, later] and results[0].task.priority == -5
    assert Task.objects.claim_next(queue="emails", path="*") == []  # not before run_after


def test_inside_atomic_the_tasks_commit_or_roll_back_with_the_callers_rows() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_many(tasks.add, [((1, 2), {})] * 3)
        Effect.objects.create(task_key="caller's row", token=0, worker="view")
        raise RuntimeError("the view failed")
    assert not Task.objects.exists() and not Effect.objects.exists()
    with transaction.atomic():
        results = enqueue_many(tasks.add, [((1, 2), {})] * 3)
    assert Task.objects.filter(pk__in=[row_id(r) for r in results]).count() == 3


def test_a_keyed_identity_met_again_is_that_task_before_or_earlier_in_the_call() -> None:
    first = tasks.charge.enqueue(1, amount=10)
    n = rows_per_insert() + 3  # the second call of order 2 in another chunk than the first
    calls = [((1,), {"amount": 10}), ((2,), {"amount": 20})] + [((100 + i,), {}) for i in range(n)] + [
        ((2,), {"amount": 20})]
    results = enqueue_many(tasks.charge, calls)
    assert results[0].id == first.id and results[0] == first  # stored before: the task as stored
    assert results[-1].id == results[1].id  # earlier in the call: the one task
    assert Task.objects.count() == n + 2
    # The two oldest (orders 1 and 2) run; the thousand after them need not for what is shown here.
    stats = work(TaskRunner("default"), owner="tester", queue="default", max_tasks=2, poll=0.02)
    assert stats.succeeded == 2
    assert Effect.objects.filter(task_key="charge:2").count() == 1
    done = enqueue_many(tasks.charge, [((2,), {"amount": 20})])
    assert done[0].id == results[1].id and done[0].status == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize("where", ["stored before", "earlier in the call", "in a later chunk"])
def test_an_identity_with_other_arguments_is_a_payload_mismatch_and_nothing_is_kept(where: str) -> None:
    if where == "stored before":
        tasks.charge.enqueue(7, amount=10)
    calls = [((i,), {}) for i in range(100, 105)]
    if where == "earlier in the call":
        calls += [((7,), {"amount": 10})]
    elif where == "in a later chunk":
        calls += [((7,), {"amount": 10})] + [((200 + i,), {}) for i in range(rows_per_insert())]
    before = sorted(Task.objects.values_list("id", "payload"))
    with pytest.raises(PayloadMismatch):
        enqueue_many(tasks.charge, [*calls, ((7,), {"amount": 99})])
    assert sorted(Task.objects.values_list("id", "payload")) == before  # none of the call's tasks


def test_a_key_that_names_other_work_is_refused_and_nothing_is_kept() -> None:
    Task.objects.ensure("order-3:charge", tenant="acme")  # claimed by key, not a Django task
    with pytest.raises(InvalidTaskKey, match="already names other work"):
        enqueue_many(tasks.charge, [((1,), {}), ((3,), {})])
    assert Task.objects.count() == 1


def test_run_again_after_a_failure_resets_the_task() -> None:
    enqueue_many(tasks.flaky_once, [((1,), {})])
    drain()
    [rerun] = enqueue_many(tasks.flaky_once, [((1,), {})])
    assert rerun.status == TaskResultStatus.READY and rerun.attempts == 0
    drain()
    rerun.refresh()
    assert (rerun.status, rerun.return_value) == (TaskResultStatus.SUCCESSFUL, 1)


def test_a_bad_argument_is_refused_before_anything_is_stored() -> None:
    with pytest.raises(TypeError, match="Unsupported type"):
        enqueue_many(tasks.add, [((1, 2), {}), ((dt.datetime.now(), 1), {})])
    assert not Task.objects.exists()


def test_task_enqueued_for_each_task_created_and_none_for_an_identity_met_again() -> None:
    tasks.charge.enqueue(1)
    heard: list[str] = []

    def hear(sender: object, task_result: object, **kwargs: object) -> None:
        heard.append(task_result.id)  # type: ignore[attr-defined]

    task_enqueued.connect(hear)
    try:
        results = enqueue_many(tasks.charge, [((1,), {}), ((2,), {}), ((3,), {}), ((2,), {})])
    finally:
        task_enqueued.disconnect(hear)
    assert heard == [results[1].id, results[2].id]


def test_an_empty_call_enqueues_nothing() -> None:
    assert enqueue_many(tasks.add, []) == []
    assert not Task.objects.exists()


def test_a_task_of_another_backend_is_refused() -> None:
    from django.test import override_settings

    from django_taskclaim.tasks.compat import FRAMEWORK

    setting = {"default": {"BACKEND": "django_taskclaim.tasks.ClaimBackend", "QUEUES": ["default", "emails"]},
               "dummy": {"BACKEND": f"{FRAMEWORK}.backends.dummy.DummyBackend"}}
    with override_settings(TASKS=setting), pytest.raises(InvalidTask, match="not a ClaimBackend"):
        enqueue_many(tasks.add.using(backend="dummy"), [((1, 2), {})])
    assert not Task.objects.exists()


# -- the store's multi-row insert -----------------------------------------------------------------
def new(key: str, payload: str | None = None, queue: str = "q") -> NewTask:
    return NewTask("", key, 5, payload, "" if payload is None else f"fp-{payload}", None, queue, 0, None, "")


def test_ensure_many_inserts_what_is_new_and_tells_what_existed() -> None:
    Task.objects.ensure("k1", queue="q")
    store = get_store("default")
    with transaction.atomic(), store.cursor(connection) as cursor:
        made = store.ensure_many(cursor, [new("k0"), new("k1"), new("k2"), new("k0")])
        found = store.read_tasks(cursor, [("", "k1"), ("", "k2"), ("", "absent")])
    assert [None if row is None else row.key for row in made] == ["k0", None, "k2", None]
    assert made[0].id < made[2].id and made[0].status == "pending" and made[0].queue == "q"  # type: ignore[union-attr]
    assert made[0].created_at == Task.objects.get(key="k0").created_at  # type: ignore[union-attr]
    assert sorted(row.key for row in found) == ["k1", "k2"]


def test_ensure_many_through_the_lifecycle_checks_payloads_and_keeps_all_or_nothing() -> None:
    rows = ensure_many([("a", "", {"n": 1}), ("b", "t", None), ("a", "", {"n": 1})], queue="default")
    assert [(row.key, created) for row, created, _ in rows] == [("a", True), ("b", True), ("a", False)]
    assert [alias for _, _, alias in rows] == [route(""), route("t"), route("")]  # each tenant's database
    assert rows[2][0].id == rows[0][0].id and rows[0][0].payload == {"n": 1}
    with pytest.raises(PayloadMismatch):
        ensure_many([("c", "", None), ("a", "", {"n": 2})], queue="default")
    assert sorted(Task.objects.values_list("key", flat=True)) == ["a", "b"]


def test_ensure_many_stores_a_payload_on_a_task_made_without_one() -> None:
    Task.objects.ensure("bare", queue="default")
    [(row, created, _)] = ensure_many([("bare", "", {"x": 1})], queue="default")
    assert not created and row.payload == {"x": 1} and Task.objects.get().payload == {"x": 1}


def test_ensure_many_sends_one_insert_per_chunk() -> None:
    n = 2 * rows_per_insert() + 1
    with CaptureQueriesContext(connection) as queries:
        ensure_many([(f"k{i}", "", None) for i in range(n)], queue="default")
    assert task_inserts(queries) == math.ceil(n / rows_per_insert())
    assert Task.objects.count() == n
