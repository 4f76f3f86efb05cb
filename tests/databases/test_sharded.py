"""Tenants routed over two task databases, in one process (configurations ``sharded``: two
PostgreSQL servers, and ``sharded_mixed``: SQLite and a PostgreSQL server).

``tests.routers.tenant_database`` sends each tenant to ``default`` or ``shard2`` by a hash of its
name; ``tests.routers.ShardRouter`` writes the test app's effects where the running ``fenced()``
block commits. Every claim, owner write, reclaim, purge, command, admin page, metric and Django
Tasks backend call must reach the tenant's database, and only it. The races between processes
and the stopped server are in tests/processes/test_sharded_processes.py.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import threading
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, connections, transaction
from django.urls import reverse
from django.utils import timezone
from prometheus_client import CollectorRegistry

from devtools.threads import call_in_thread
from django_taskclaim import metrics, routing
from django_taskclaim.exceptions import StaleClaim, TaskClaimError
from django_taskclaim.models import Attempt, Task
from django_taskclaim.worker import work
from tests.routers import tenant_database
from tests.sharding import ON_A, ON_B, SHARDED_TESTS, A, B
from tests.testapp.models import Effect

pytestmark = SHARDED_TESTS
CHANGELIST = "admin:django_taskclaim_task_changelist"


def keys_on(alias: str) -> set[tuple[str, str]]:
    return set(Task.objects.db_manager(alias).values_list("tenant", "key"))


def expire_on(alias: str, **lookup: Any) -> None:
    Task.objects.db_manager(alias).filter(**lookup).update(lease_expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_the_configuration_routes_tenants_to_both_databases() -> None:
    assert routing.databases() == (A, B) and Task.objects.databases() == (A, B)
    assert {tenant_database(t) for t in ON_A} == {A} and {tenant_database(t) for t in ON_B} == {B}
    assert tenant_database("") == A  # the single-tenant suite's tasks stay in default


def test_each_tenants_tasks_and_their_owners_writes_stay_in_its_database() -> None:
    a = Task.objects.claim("report", tenant=ON_A[0]).claim
    b = Task.objects.claim("report", tenant=ON_B[0]).claim  # the same key, another tenant
    Task.objects.ensure("later", tenant=ON_B[1])
    assert a is not None and b is not None and (a.using, b.using) == (A, B)
    assert keys_on(A) == {(ON_A[0], "report")}
    assert keys_on(B) == {(ON_B[0], "report"), (ON_B[1], "later")}
    b.heartbeat()
    b.complete({"where": "b"})
    a.fail("boom", retry=True)
    assert Task.objects.for_tenant(ON_B[0]).get(key="report").result == {"where": "b"}
    assert Task.objects.for_tenant(ON_A[0]).get(key="report").status == "pending"
    assert Attempt.objects.using(B).filter(task__key="report").values_list("outcome", flat=True).get() == "succeeded"
    # A second claim of B's task goes to B: it finds it done, and records the duplicate there.
    again = Task.objects.claim("report", tenant=ON_B[0])
    assert not again.claimed and again.task.status == "succeeded" and again.task._state.db == B
    assert Attempt.objects.using(B).filter(outcome="duplicate").count() == 1
    assert not Attempt.objects.using(A).filter(outcome="duplicate").exists()


def test_claim_next_takes_turns_between_the_databases() -> None:
    """Each call starts at the next database: a busy database does not starve the other."""
    for i in range(10):
        Task.objects.ensure(f"a-{i}", tenant=ON_A[0], queue="default")
    Task.objects.ensure("b-0", tenant=ON_B[0], queue="default")
    first_two = [c for _ in range(2) for c in Task.objects.claim_next()]
    assert sorted(c.using for c in first_two) == [A, B], first_two
    for i in range(1, 4):
        Task.objects.ensure(f"b-{i}", tenant=ON_B[1], queue="default")
    turns = [Task.objects.claim_next()[0].using for _ in range(6)]
    assert turns in ([A, B] * 3, [B, A] * 3), turns
    # B has nothing left: each call that starts there goes on to A in the same call, before any
    # worker would sleep.
    assert [c.using for _ in range(4) for c in Task.objects.claim_next()] == [A] * 4


def test_claim_next_of_a_tenant_goes_to_its_database_only() -> None:
    Task.objects.ensure("a", tenant=ON_A[0], queue="default")
    Task.objects.ensure("b", tenant=ON_B[0], queue="default")
    claims = Task.objects.claim_next(tenant=ON_B[0], limit=5)
    assert [(c.key, c.using) for c in claims] == [("b", B)]
    assert Task.objects.claim_next(tenant=ON_B[0]) == []
    with pytest.raises(TaskClaimError, match="lives in database 'shard2'"):
        Task.objects.db_manager(A).claim_next(tenant=ON_B[0])


def test_complete_and_claim_next_for_a_tenant_of_the_other_database_claims_there() -> None:
    Task.objects.ensure("a", tenant=ON_A[0], queue="default")
    Task.objects.ensure("b", tenant=ON_B[0], queue="default")
    [a] = Task.objects.claim_next(tenant=ON_A[0])
    # The completion commits in A; B's task is claimed in B (one statement cannot span both).
    [b] = a.complete_and_claim_next({"done": "a"}, tenant=ON_B[0])
    assert (b.key, b.tenant, b.using) == ("b", ON_B[0], B)
    assert Task.objects.db_manager(A).get(key="a").status == Task.Status.SUCCEEDED
    assert Task.objects.db_manager(B).get(key="b").owner == a.owner
    assert b.complete_and_claim_next(tenant=ON_A[0]) == []  # nothing left in A: claimed nothing, completed b
    assert Task.objects.db_manager(B).get(key="b").status == Task.Status.SUCCEEDED


def test_a_worker_serves_each_database_in_a_lane_of_its_own_and_drains_every_one() -> None:
    for i in range(3):
        Task.objects.ensure(f"a-{i}", tenant=ON_A[0], queue="default")
        Task.objects.ensure(f"b-{i}", tenant=ON_B[0], queue="default")
    Task.objects.ensure("b-3", tenant=ON_B[1], queue="default")
    seen: list[tuple[str, str]] = []
    stats = work(lambda claim: seen.append((claim.using, threading.current_thread().name)), batch=2, poll=0.01,
                 until_drained=True)
    assert stats.succeeded == 7 and sorted(using for using, _ in seen) == [A] * 3 + [B] * 4
    # One thread per database (a busy or hung one never holds up the other), none of them this one.
    lanes = {using: {thread for u, thread in seen if u == using} for using in (A, B)}
    assert lanes == {A: {f"taskclaim-lane-{A}"}, B: {f"taskclaim-lane-{B}"}}, lanes
    assert not Task.objects.db_manager(A).unfinished().exists() and not Task.objects.db_manager(B).unfinished().exists()


def test_max_tasks_counts_the_tasks_of_every_lane() -> None:
    for i in range(4):
        Task.objects.ensure(f"a-{i}", tenant=ON_A[0], queue="default")
        Task.objects.ensure(f"b-{i}", tenant=ON_B[0], queue="default")
    stats = work(lambda claim: None, batch=3, poll=0.01, max_tasks=5)
    assert stats.succeeded == 5
    done = sum(Task.objects.db_manager(alias).filter(status="succeeded").count() for alias in (A, B))
    left = sum(Task.objects.db_manager(alias).filter(status="pending").count() for alias in (A, B))
    assert (done, left) == (5, 3)  # nothing claimed beyond the limit and left running


@pytest.mark.parametrize("concurrency", [1, 2])
def test_max_tasks_ends_with_every_task_on_one_database_and_none_on_the_other(concurrency: int) -> None:
    """The lane of the empty database keeps taking what is left of ``max_tasks``, claiming nothing and
    giving it back; the other lane, asking at that instant, waits rather than stop, and both end once
    ``max_tasks`` were claimed (it used to hang: the deterministic interleavings are in
    tests/processes/test_worker.py)."""
    for i in range(10):
        Task.objects.ensure(f"a-{i}", tenant=ON_A[0], queue="default")
    stats = call_in_thread(lambda: work(lambda claim: None, batch=3, poll=0.01, max_tasks=4,
                                        concurrency=concurrency),
                           timeout=120, what="a worker over two databases to claim max_tasks=4 and end")
    assert stats.succeeded == 4
    assert Task.objects.db_manager(A).filter(status="succeeded").count() == 4
    assert Task.objects.db_manager(A).filter(status="pending").count() == 6


def test_reclaim_covers_every_database_unless_the_manager_is_bound_to_one() -> None:
    for tenant in (ON_A[0], ON_B[0], ON_B[1]):
        Task.objects.claim("job", tenant=tenant, lease=600)
    expire_on(A)
    expire_on(B)
    assert Task.objects.db_manager(B).reclaim_expired(limit=1) == 1
    assert Task.objects.reclaim_expired() == 2
    assert set(Task.objects.db_manager(A).values_list("status", flat=True)) == {"pending"}
    assert set(Task.objects.db_manager(B).values_list("status", flat=True)) == {"pending"}


# ---- fenced(): the effect commits on the claim's database, never elsewhere ------------------

def test_fenced_effects_commit_on_the_claims_database() -> None:
    for tenant, alias in ((ON_A[0], A), (ON_B[0], B)):
        claim = Task.objects.claim("pay", tenant=tenant).claim
        assert claim is not None
        with claim.fenced():
            assert routing.fenced_database() == alias
            Effect.objects.create(task_key=f"pay:{tenant}", token=claim.token, worker="w")
            claim.complete("paid")
        assert routing.fenced_database() is None
        assert Effect.objects.using(alias).filter(task_key=f"pay:{tenant}").count() == 1
    assert Effect.objects.using(A).count() == 1 and Effect.objects.using(B).count() == 1


def test_fenced_refuses_a_write_to_the_other_database_before_it_is_sent() -> None:
    claim = Task.objects.claim("pay", tenant=ON_B[0]).claim
    assert claim is not None
    with pytest.raises(TaskClaimError) as refused, claim.fenced():
        claim.complete("paid")  # written in the block: rolled back with it
        Effect.objects.using(A).create(task_key="pay", token=claim.token, worker="w")
    message = str(refused.value)
    assert "commits on database 'shard2'" in message and "wrote to database 'default'" in message
    assert "Nothing was written to 'default'" in message
    assert not Effect.objects.using(A).exists() and not Effect.objects.using(B).exists()
    task = Task.objects.for_tenant(ON_B[0]).get(key="pay")
    assert task.status == "running" and task.fencing_token == claim.token  # the completion rolled back
    # A claim of a tenant of the other database is a write there too.
    with pytest.raises(TaskClaimError, match="wrote to database 'default'"), claim.fenced():
        Task.objects.claim("other", tenant=ON_A[0])
    assert not keys_on(A)
    with claim.fenced():  # the claim still holds its task: the right write commits
        Effect.objects.create(task_key="pay", token=claim.token, worker="w")
        Effect.objects.using(A).filter(task_key="pay").exists()  # reading elsewhere is allowed
        claim.complete("paid")
    assert Effect.objects.using(B).filter(task_key="pay").count() == 1
    assert Task.objects.for_tenant(ON_B[0]).get(key="pay").status == "succeeded"


def hidden_writes_to(alias: str) -> list[str]:
    """Writes to ``alias`` whose first word is not one (each that its database runs)."""
    insert = "INSERT INTO testapp_effect (task_key, token, worker, created_at) VALUES ('hidden', 1, 'w', {now})"
    if connections[alias].vendor != "postgresql":
        insert = insert.format(now="'2026-01-01 00:00:00'")
        return [f"/* app */ {insert}", f"-- x\n{insert}"]
    insert = insert.format(now="now()")
    return [f"/* app */ {insert}", f"-- x\n{insert}", "SELECT taskclaim_test_write()", f"DO $$ BEGIN {insert}; END $$"]


def test_fenced_refuses_writes_that_hide_their_first_word_on_the_other_server() -> None:
    """The other database refuses them itself: a statement's text cannot tell every write."""
    for alias in (A, B):
        if connections[alias].vendor == "postgresql":
            with connections[alias].cursor() as cursor:
                cursor.execute("CREATE OR REPLACE FUNCTION taskclaim_test_write() RETURNS int AS $$ INSERT INTO "
                               "testapp_effect (task_key, token, worker, created_at) VALUES ('hidden', 1, 'f', now()); "
                               "SELECT 1 $$ LANGUAGE sql")
    try:
        for tenant, other in ((ON_A[0], B), (ON_B[0], A)):
            claim = Task.objects.claim("pay", tenant=tenant).claim
            assert claim is not None
            for sql in hidden_writes_to(other):
                with pytest.raises(TaskClaimError, match=f"wrote to database {other!r}"), claim.fenced():
                    claim.complete("paid")
                    with connections[other].cursor() as cursor:
                        cursor.execute(sql)
                assert not Effect.objects.using(other).exists(), sql
            with claim.fenced():  # reading the other database still works, and its writes after the block
                assert not Effect.objects.using(other).exists()
                claim.complete("paid")
            Effect.objects.using(other).create(task_key="after", token=0, worker="w")
            assert Task.objects.for_tenant(tenant).get(key="pay").status == "succeeded"
    finally:
        for alias in (A, B):
            if connections[alias].vendor == "postgresql":
                with connections[alias].cursor() as cursor:
                    cursor.execute("DROP FUNCTION IF EXISTS taskclaim_test_write()")


def test_fenced_leaves_the_other_servers_open_transaction_writable() -> None:
    """A transaction on the other database opened before the block (ATOMIC_REQUESTS on default):
    the block's reads there run read-only, its hidden write is refused, and the transaction goes on
    writing after the block."""
    claim = Task.objects.claim("pay", tenant=ON_B[0]).claim
    assert claim is not None
    with transaction.atomic(using=A):
        Effect.objects.using(A).create(task_key="before", token=0, worker="w")
        with claim.fenced():
            assert Effect.objects.using(A).filter(task_key="before").count() == 1
        with pytest.raises(TaskClaimError, match="wrote to database 'default'"), claim.fenced(), \
                connections[A].cursor() as cursor:
            cursor.execute(hidden_writes_to(A)[1])
        Effect.objects.using(A).create(task_key="after", token=0, worker="w")
    assert sorted(Effect.objects.using(A).values_list("task_key", flat=True)) == ["after", "before"]


def test_a_stale_claim_on_either_database_writes_nothing() -> None:
    for tenant, alias in ((ON_A[0], A), (ON_B[0], B)):
        old = Task.objects.claim("job", tenant=tenant, owner="old", lease=600).claim
        assert old is not None
        expire_on(alias, key="job", tenant=tenant)
        new = Task.objects.claim("job", tenant=tenant, owner="new").claim  # a takeover in its database
        assert new is not None and new.token == 2 and new.using == alias
        with pytest.raises(StaleClaim), old.fenced():
            Effect.objects.create(task_key="job", token=old.token, worker="old")
        assert not Effect.objects.using(alias).exists()
        assert Attempt.objects.using(alias).get(task__tenant=tenant, token=1).outcome == "taken_over"


# ---- the operators' commands, across both databases or one ---------------------------------

def plant_overlap(alias: str, tenant: str, key: str) -> None:
    """Two claims of one task whose executions overlap: what the audit exists to find."""
    task = Task.objects.db_manager(alias).ensure(key, tenant=tenant)
    start = timezone.now() - dt.timedelta(minutes=5)
    second = start + dt.timedelta(seconds=30)
    Attempt.objects.using(alias).create(task=task, token=1, owner="ghost-a", started_at=start,
                                        ended_at=start + dt.timedelta(seconds=60), outcome="succeeded")
    Attempt.objects.using(alias).create(task=task, token=2, owner="ghost-b", started_at=second,
                                        ended_at=second + dt.timedelta(seconds=60), outcome="succeeded")


def test_reclaim_command_across_both_databases_and_with_database() -> None:
    for tenant in (ON_A[0], ON_B[0], ON_B[1]):
        Task.objects.claim("job", tenant=tenant, lease=600)
    expire_on(A)
    expire_on(B)
    dry = json.loads(run("taskclaim_reclaim", "--dry-run", "--json"))
    assert sorted((r["tenant"], r["database"]) for r in dry["reclaimed"]) == sorted(
        [(ON_A[0], A), (ON_B[0], B), (ON_B[1], B)])
    doc = json.loads(run("taskclaim_reclaim", "--database", "shard2", "--json"))
    assert sorted(r["tenant"] for r in doc["reclaimed"]) == sorted([ON_B[0], ON_B[1]])
    assert Task.objects.for_tenant(ON_A[0]).get().status == "running"  # another database: left alone
    text = run("taskclaim_reclaim", "-v", "2")
    assert f"reclaimed 'job' tenant={ON_A[0]!r} token=1 -> pending database=default" in text
    assert "reclaim: 1 expired task(s): 1 back to pending" in text
    with pytest.raises(CommandError, match="'shard9' is not a task database"):
        call_command("taskclaim_reclaim", "--database", "shard9")


def test_purge_command_across_both_databases_and_with_database() -> None:
    for tenant in (ON_A[0], ON_B[0]):
        claim = Task.objects.claim("old", tenant=tenant).claim
        assert claim is not None
        claim.complete()
    for alias in (A, B):
        Task.objects.db_manager(alias).update(updated_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    dry = json.loads(run("taskclaim_purge", "--older-than", "1d", "--dry-run", "--json"))
    assert dry["tasks"] == 2 and dry["attempts"] == 2
    assert {alias: d["tasks"] for alias, d in dry["databases"].items()} == {A: 1, B: 1}
    doc = json.loads(run("taskclaim_purge", "--older-than", "1d", "--database", "default", "--json"))
    assert doc["tasks"] == 1 and not keys_on(A) and keys_on(B) == {(ON_B[0], "old")}
    assert "deleted 1 task(s) and 1 attempt(s)" in run("taskclaim_purge", "--older-than", "1d")
    assert not keys_on(B) and not Attempt.objects.using(B).exists()


def test_inspect_finds_the_task_in_its_tenants_database() -> None:
    Task.objects.claim("job", tenant=ON_B[0], owner="worker-b")
    Task.objects.ensure("mail", tenant=ON_A[0], queue="mail")
    Task.objects.ensure("mail", tenant=ON_B[0], queue="mail")
    doc = json.loads(run("taskclaim_inspect", "job", "--tenant", ON_B[0], "--json"))
    assert doc["database"] == B and doc["task"]["owner"] == "worker-b" and len(doc["attempts"]) == 1
    assert f"tenant={ON_B[0]!r}" in run("taskclaim_inspect", "job", "--tenant", ON_B[0])
    with pytest.raises(CommandError, match=rf"no task 'job' for tenant {ON_A[0]!r} in database 'default'; "
                                           rf"it exists for tenant\(s\) {ON_B[0]!r} \(in shard2\)"):
        call_command("taskclaim_inspect", "job", "--tenant", ON_A[0], stdout=io.StringIO())
    queues = json.loads(run("taskclaim_inspect", "--json"))["queues"]
    assert sorted((q["queue"], q["database"], q["due"]) for q in queues) == [("mail", A, 1), ("mail", B, 1)]
    only_b = json.loads(run("taskclaim_inspect", "--database", "shard2", "--json"))["queues"]
    assert [(q["database"], q["due"]) for q in only_b] == [(B, 1)]


def test_audit_reads_every_database_and_names_where_it_found_an_overlap() -> None:
    plant_overlap(B, ON_B[0], "twice")
    Task.objects.claim("clean", tenant=ON_A[0]).claim.complete()  # type: ignore[union-attr]
    with pytest.raises(CommandError) as found:
        run("taskclaim_audit")
    assert found.value.returncode == 1
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("taskclaim_audit", "--json", stdout=out)
    doc = json.loads(out.getvalue())
    assert doc["databases"] == [A, B] and doc["overlaps"]["count"] == 1
    assert doc["overlaps"]["items"][0]["database"] == B and doc["overlaps"]["items"][0]["tenant"] == ON_B[0]
    clean = json.loads(run("taskclaim_audit", "--database", "default", "--json"))
    assert clean["databases"] == [A] and clean["overlaps"]["count"] == 0
    assert json.loads(run("taskclaim_audit", "--tenant", ON_A[0], "--json"))["databases"] == [A]
    with pytest.raises(CommandError, match="lives in database 'shard2'"):
        call_command("taskclaim_audit", "--tenant", ON_B[0], "--database", "default", stdout=io.StringIO())


# ---- the admin and the metrics: per database ------------------------------------------------

def test_the_admin_lists_and_acts_per_database(admin_client) -> None:  # type: ignore[no-untyped-def]
    a = Task.objects.claim("on-a", tenant=ON_A[0], lease=600).claim
    b = Task.objects.claim("on-b", tenant=ON_B[0], lease=600).claim
    assert a is not None and b is not None
    page = admin_client.get(reverse(CHANGELIST))
    assert [t.key for t in page.context["cl"].result_list] == ["on-a"]
    assert "task database" in page.content.decode()
    page = admin_client.get(reverse(CHANGELIST), {"database": "shard2"})
    assert [t.key for t in page.context["cl"].result_list] == ["on-b"]
    assert admin_client.get(reverse(CHANGELIST), {"database": "shard9"}).status_code == 302  # ?e=1
    change = reverse("admin:django_taskclaim_task_change", args=[b.task_id])
    detail = admin_client.get(change, {"database": "shard2"}).content.decode()
    assert "on-b" in detail and b.owner in detail  # the task and its attempt, from shard2
    assert "on-b" not in admin_client.get(change).content.decode()  # the same id in default is not it
    # An action on a selection of the shard2 list runs there (the same id in default is untouched).
    done = admin_client.post(reverse(CHANGELIST) + "?database=shard2",
                             {"action": "release", "index": 0, "_selected_action": [b.task_id]}, follow=True)
    assert done.status_code == 200
    assert Task.objects.for_tenant(ON_B[0]).get().status == "pending"
    assert Task.objects.for_tenant(ON_A[0]).get().status == "running"
    with pytest.raises(StaleClaim):
        b.complete()


def test_metrics_have_a_series_per_database() -> None:
    registry = CollectorRegistry()
    metrics.install(registry)
    try:
        Task.objects.claim("m", tenant=ON_A[0])
        Task.objects.claim("m", tenant=ON_B[0])
        Task.objects.claim("n", tenant=ON_B[1])
        Task.objects.ensure("p", tenant=ON_B[0])

        def sample(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(name, labels)

        assert sample("taskclaim_claims_total", outcome="claimed", database=A) == 1
        assert sample("taskclaim_claims_total", outcome="claimed", database=B) == 2
        assert sample("taskclaim_tasks", status="running", database=A) == 1
        assert sample("taskclaim_tasks", status="running", database=B) == 2
        assert sample("taskclaim_tasks", status="pending", database=B) == 1
        assert sample("taskclaim_database_up", database=A) == sample("taskclaim_database_up", database=B) == 1
    finally:
        metrics.uninstall(registry)


# ---- the Django Tasks backend ----------------------------------------------------------------

def test_django_tasks_are_enqueued_and_run_in_their_tenants_database() -> None:
    from django_taskclaim.tasks.compat import TaskResultDoesNotExist, TaskResultStatus, task_backends
    from django_taskclaim.tasks.runner import TaskRunner
    from tests.programs.routing_tasks import invoice

    results = {tenant: invoice.enqueue(tenant, 1) for tenant in (ON_A[0], ON_B[0], ON_B[1])}
    for tenant, result in results.items():
        alias = tenant_database(tenant)
        assert result.id.startswith(f"{alias}:") and len(result.id) < 64
        assert invoice.get_result(result.id).status == TaskResultStatus.READY
    assert invoice.enqueue(ON_B[0], 1).id == results[ON_B[0]].id  # one task per identity
    assert len(keys_on(A)) == 1 and len(keys_on(B)) == 2
    stats = work(TaskRunner("default"), queue=["default"], poll=0.01, until_drained=True)
    assert stats.succeeded == 3
    for tenant, result in results.items():
        alias = tenant_database(tenant)
        done = task_backends["default"].get_result(result.id)
        assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == {"database": alias}
        assert Effect.objects.using(alias).filter(task_key=f"invoice:{tenant}:1").count() == 1
    backend = task_backends["default"]
    pk = results[ON_B[0]].id.split(":")[1]
    for unknown in ("shard9:1", f"default:{pk}999", "shard2:", ":1", "shard2:x", "shard2:1:2"):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(unknown)


def test_with_several_databases_only_alias_colon_pk_names_a_result() -> None:
    """A bare primary key (or one after an empty alias) names no database among several: it is not
    read from TASKCLAIM_DATABASE's, where another task has that number."""
    from django_taskclaim.tasks.compat import TaskResultDoesNotExist, TaskResultStatus, task_backends
    from tests.programs.routing_tasks import invoice

    on_a = invoice.enqueue(ON_A[0], 1)
    pk = on_a.id.split(":")[1]
    backend = task_backends["default"]
    assert backend.get_result(f"{A}:{pk}").status == TaskResultStatus.READY
    for ambiguous in (pk, f":{pk}"):
        with pytest.raises(TaskResultDoesNotExist, match="'alias:pk'"):
            backend.get_result(ambiguous)


def test_w201_says_which_tasks_are_stored_where() -> None:
    from django_taskclaim.tasks import ClaimBackend

    (warning,) = ClaimBackend("z", {}).check()
    assert warning.id == "django_taskclaim.W201"
    assert warning.msg == (f"Task backend 'z' stores the tasks of the tenants routed to {B!r} in that database, "
                           f"the other tenants' in {A!r}.")


def test_a_bulk_enqueue_puts_each_task_in_its_tenants_database_all_or_nothing() -> None:
    from django_taskclaim.exceptions import PayloadMismatch
    from django_taskclaim.tasks import enqueue_many
    from django_taskclaim.tasks.compat import TaskResultStatus
    from tests.programs.routing_tasks import invoice

    # One call per database (the tenants grouped by ClaimBackend.database_for): one transaction each.
    for tenants in ([ON_A[0], ON_A[1]], [ON_B[0], ON_B[1]]):
        results = enqueue_many(invoice, [((tenant, 1), {}) for tenant in tenants])
        assert [r.id.split(":")[0] for r in results] == [tenant_database(t) for t in tenants]
        assert all(invoice.get_result(r.id).status == TaskResultStatus.READY for r in results)
    assert len(keys_on(A)) == 2 and len(keys_on(B)) == 2
    # A mismatch keeps nothing of the call.
    with pytest.raises(PayloadMismatch):  # the last: ON_B[0]'s identity, other arguments
        enqueue_many(invoice, [((ON_B[2], 1), {}), ((ON_B[0], "1"), {})])
    assert len(keys_on(B)) == 2
    # In the caller's transaction on the tenants' database, the tasks roll back with it.
    with pytest.raises(RuntimeError), transaction.atomic(using=B):
        enqueue_many(invoice, [((ON_B[2], 1), {})])
        raise RuntimeError
    assert len(keys_on(B)) == 2


def test_a_bulk_enqueue_over_two_databases_is_refused_before_anything_is_written() -> None:
    """One call cannot commit in two databases at once (no two-phase commit with the servers'
    default settings): when one of them refused its part at COMMIT, the other's tasks stayed
    committed and ran. A call whose tasks span databases is refused before the first insert."""
    from django_taskclaim.tasks import enqueue_many
    from tests.programs.routing_tasks import invoice

    calls = [((tenant, n), {}) for n in range(5) for tenant in (ON_A[0], ON_B[0])]  # 5 in A, 5 in B
    # The first database refuses its part at COMMIT: a foreign key that Django declares
    # DEFERRABLE INITIALLY DEFERRED (PostgreSQL, SQLite), broken in the caller's transaction.
    with pytest.raises((TaskClaimError, IntegrityError)) as failed, transaction.atomic(using=A):
        Attempt.objects.using(A).create(task_id=2**40, token=1, owner="dangling")
        enqueue_many(invoice, calls)
    assert not keys_on(B), "the second database's tasks stayed committed"
    assert not keys_on(A)
    message = str(failed.value)
    assert isinstance(failed.value, TaskClaimError), message
    assert "'default'" in message and "'shard2'" in message and "one database" in message
    # Outside any transaction too: nothing of the call in either.
    with pytest.raises(TaskClaimError, match="spans task databases"):
        enqueue_many(invoice, calls)
    assert not keys_on(A) and not keys_on(B)
