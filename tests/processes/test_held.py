"""A claim held inside ``fenced()`` past its lease is *held*: every operator view says so alike.

Another OS process claims a task with a short lease, enters ``fenced()`` and waits there until
its lease has run out by the database clock. Its open transaction locks the row, so no one can
reclaim or take it over: the queryset, the reclaim command (dry run and real), inspect, the
admin and the metrics must all report it as held, and the probe that finds out must wait for
no lock and keep none.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.urls import reverse
from prometheus_client import CollectorRegistry

from devtools.polling import wait_until
from devtools.processes import Child
from django_taskclaim import metrics
from django_taskclaim.models import Task, held_ids
from django_taskclaim.store import get_store
from tests.conftest import expire
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def lockable_elsewhere(pk: int) -> bool:
    """From a connection of another thread: can a transaction lock task ``pk`` now?"""
    answer: list[bool] = []

    def probe() -> None:
        try:
            with connections["default"].cursor() as cursor:
                answer.append(get_store("default").row_free(cursor, pk) is not None)
        finally:
            connections["default"].close()

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join(timeout=60)
    return answer == [True]


@pytest.fixture
def held_owner(processes, spawn) -> Iterator[tuple[Child, Task]]:  # type: ignore[no-untyped-def]
    """A process inside ``fenced()`` of task "job" whose lease has expired; and "gone", expired and free."""
    if not get_store("default").row_locks:
        pytest.skip("SQLite has no row locks (see test_sqlite_reports_nothing_held)")
    owner = spawn("fenced-owner", "job", "--lease", "1")
    owner.event("inside", timeout=60)
    wait_until(lambda: Task.objects.expired().filter(key="job").exists(), timeout=60,
               what="the owner's lease to run out by the database clock")
    gone = Task.objects.claim("gone", owner="dead-worker", lease=600).claim
    assert gone is not None
    expire(gone)
    yield owner, Task.objects.get(key="job")
    owner.send("go")  # let it commit, so that its transaction ends
    processes.join(timeout=60)


def finish(owner: Child) -> None:
    """Let the owner write its effect and complete: the probes left it no lock to wait for."""
    owner.send("go")
    assert owner.finish(30) == {"event": "committed", "token": 1}


def test_the_querysets_tell_held_from_expired(held_owner) -> None:  # type: ignore[no-untyped-def]
    owner, job = held_owner
    assert set(Task.objects.expired().values_list("key", flat=True)) == {"job", "gone"}  # the lease fact
    assert list(Task.objects.held().values_list("key", flat=True)) == ["job"]
    assert list(Task.objects.reclaimable().values_list("key", flat=True)) == ["gone"]
    assert held_ids("default", [job.pk, Task.objects.get(key="gone").pk]) == {job.pk}
    finish(owner)
    assert not Task.objects.held().exists()
    assert Task.objects.get(key="job").status == Task.Status.SUCCEEDED


def test_reclaim_dry_run_and_reclaim_say_what_they_skip_and_why(held_owner) -> None:  # type: ignore[no-untyped-def]
    owner, job = held_owner
    text = run("taskclaim_reclaim", "--dry-run")
    assert "would reclaim 'gone'" in text and "would reclaim 'job'" not in text
    assert "would skip held 'job' tenant='' token=1" in text
    assert "1 held task(s) would be skipped: lease expired, but its row is locked by an open transaction" in text
    assert "reclaim (dry run): 1 expired task(s) found" in text
    doc = json.loads(run("taskclaim_reclaim", "--dry-run", "--json"))
    assert [r["key"] for r in doc["reclaimed"]] == ["gone"]
    assert [(h["key"], h["token"], h["id"]) for h in doc["held"]] == [("job", 1, job.pk)]

    text = run("taskclaim_reclaim")
    assert "skipped held 'job' tenant='' token=1" in text
    assert "reclaim: 1 held task(s) skipped: lease expired, but its row is locked" in text
    assert "reclaim: 1 expired task(s): 1 back to pending" in text
    assert Task.objects.get(key="gone").status == Task.Status.PENDING
    doc = json.loads(run("taskclaim_reclaim", "--json"))
    assert doc["reclaimed"] == [] and [h["key"] for h in doc["held"]] == ["job"]
    finish(owner)
    assert list(Effect.objects.values_list("task_key", "token")) == [("job", 1)]
    doc = json.loads(run("taskclaim_reclaim", "--json"))
    assert doc["reclaimed"] == [] and doc["held"] == []


def test_inspect_admin_and_metrics_report_it_held(held_owner, admin_client) -> None:  # type: ignore[no-untyped-def]
    owner, job = held_owner
    text = run("taskclaim_inspect", "job")
    assert "status        running (held: lease expired" in text and "locked by an open transaction" in text
    assert "held" not in run("taskclaim_inspect", "gone")
    assert json.loads(run("taskclaim_inspect", "job", "--json"))["task"]["held"] is True
    assert json.loads(run("taskclaim_inspect", "gone", "--json"))["task"]["held"] is False

    changelist = reverse("admin:django_taskclaim_task_changelist")
    response = admin_client.get(changelist)
    admin = response.context["cl"].model_admin
    rows = {t.key: t for t in response.context["cl"].result_list}
    assert admin.lease(rows["job"]).startswith("held: expired ")
    assert admin.lease(rows["gone"]).startswith("expired ")
    assert {t.key for t in admin_client.get(changelist, {"lease": "held"}).context["cl"].result_list} == {"job"}
    assert {t.key for t in admin_client.get(changelist, {"lease": "expired"}).context["cl"].result_list} == {"gone"}
    detail = admin_client.get(reverse("admin:django_taskclaim_task_change", args=[job.pk])).content.decode()
    assert "held: expired " in detail

    registry = CollectorRegistry()
    metrics.install(registry)
    try:
        db = {"database": Task.objects.db}
        assert registry.get_sample_value("taskclaim_held_leases", db) == 1
        assert registry.get_sample_value("taskclaim_expired_leases", db) == 1
    finally:
        metrics.uninstall(registry)
    finish(owner)


def test_the_probe_keeps_no_lock_inside_a_transaction(held_owner) -> None:  # type: ignore[no-untyped-def]
    """As a view under ATOMIC_REQUESTS would: a write first, then the probe, then more work.
    The free row the probe looked at stays free for others while the transaction goes on."""
    owner, job = held_owner
    gone = Task.objects.get(key="gone")
    with transaction.atomic():
        Effect.objects.create(task_key="unrelated", token=0, worker="view")  # the transaction holds a lock
        assert held_ids("default", [job.pk, gone.pk]) == {job.pk}
        assert lockable_elsewhere(gone.pk)
        assert list(Task.objects.held().values_list("key", flat=True)) == ["job"]
        assert lockable_elsewhere(gone.pk)
    finish(owner)


def test_sqlite_reports_nothing_held(spawn) -> None:  # type: ignore[no-untyped-def]
    """SQLite locks the database, not rows: held() is always empty there (docs/operations.md)."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only")
    claim = Task.objects.claim("job", owner="w", lease=600).claim
    assert claim is not None
    expire(claim)
    assert not Task.objects.held().exists()
    assert list(Task.objects.reclaimable().values_list("key", flat=True)) == ["job"]
    assert held_ids("default", [claim.task_id]) == set()
