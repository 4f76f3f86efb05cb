"""The optional Prometheus integration: counters fed by the signals, gauges read from the DB."""

from __future__ import annotations

import pytest
from django.test import RequestFactory
from prometheus_client import CollectorRegistry

from django_taskclaim import metrics
from django_taskclaim.exceptions import StaleClaim
from django_taskclaim.models import Task
from tests.conftest import expire

# Signals are sent on commit: these tests run outside a wrapping transaction.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def registry():  # type: ignore[no-untyped-def]
    registry = CollectorRegistry()
    metrics.install(registry)
    yield registry
    metrics.uninstall(registry)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample of the task database's series (every metric has a ``database`` label)."""
    got = registry.get_sample_value(name, {**labels, "database": Task.objects.db})
    return 0.0 if got is None else got


def test_counters_follow_the_events(registry) -> None:  # type: ignore[no-untyped-def]
    first = Task.objects.claim("m-1", owner="a", lease=600).claim
    assert first
    Task.objects.claim("m-1", owner="dup")  # running: a duplicate delivery
    expire(first)
    second = Task.objects.claim("m-1", owner="b").claim
    assert second
    with pytest.raises(StaleClaim):
        first.complete()
    with pytest.raises(StaleClaim):
        first.heartbeat()
    second.complete("ok")
    Task.objects.claim("m-1", owner="late")  # succeeded: a duplicate too
    f = Task.objects.claim("m-2").claim
    assert f
    f.fail("boom", retry=True)
    f2 = Task.objects.claim("m-2").claim
    assert f2
    f2.release()
    Task.objects.claim("m-2", lease=600)
    Task.objects.filter(key="m-2").force_release()
    gone = Task.objects.claim("m-3", lease=600).claim
    assert gone
    expire(gone)
    Task.objects.reclaim_expired()

    assert value(registry, "taskclaim_claims_total", outcome="claimed") == 5
    assert value(registry, "taskclaim_claims_total", outcome="taken_over") == 1
    assert value(registry, "taskclaim_claims_total", outcome="duplicate") == 2
    assert value(registry, "taskclaim_takeovers_total") == 1
    assert value(registry, "taskclaim_duplicate_deliveries_total") == 2
    assert value(registry, "taskclaim_fenced_writes_total", action="complete") == 1
    assert value(registry, "taskclaim_fenced_writes_total", action="heartbeat") == 1
    assert value(registry, "taskclaim_finished_total", outcome="succeeded") == 1
    assert value(registry, "taskclaim_finished_total", outcome="retry") == 1
    assert value(registry, "taskclaim_finished_total", outcome="released") == 1
    assert value(registry, "taskclaim_finished_total", outcome="force_released") == 1
    assert value(registry, "taskclaim_reclaimed_total", status="pending") == 1


def test_gauges_query_the_database_at_scrape_time(registry) -> None:  # type: ignore[no-untyped-def]
    assert value(registry, "taskclaim_tasks", status="pending") == 0
    for i in range(3):
        Task.objects.ensure(f"g-{i}")
    live = Task.objects.claim("g-live", lease=600).claim
    old = Task.objects.claim("g-old", lease=600).claim
    assert live and old
    expire(old)
    assert value(registry, "taskclaim_tasks", status="pending") == 3
    assert value(registry, "taskclaim_tasks", status="running") == 2
    assert value(registry, "taskclaim_tasks", status="succeeded") == 0
    assert registry.get_sample_value("taskclaim_tasks", {"status": "cancelled", "database": Task.objects.db}) == 0
    assert value(registry, "taskclaim_expired_leases") == 1
    live.complete()
    assert value(registry, "taskclaim_tasks", status="succeeded") == 1


def test_install_is_idempotent_and_uninstall_disconnects(registry) -> None:  # type: ignore[no-untyped-def]
    assert metrics.install(registry) is metrics.install(registry)
    Task.objects.claim("once")
    assert value(registry, "taskclaim_claims_total", outcome="claimed") == 1  # not twice
    metrics.uninstall(registry)
    claimed = {"outcome": "claimed", "database": Task.objects.db}
    assert registry.get_sample_value("taskclaim_claims_total", claimed) is None
    Task.objects.claim("after")
    again = metrics.install(registry)  # re-registering works after uninstall
    assert again is not None
    assert value(registry, "taskclaim_claims_total", outcome="claimed") == 0


def test_counters_only_without_database_gauges() -> None:
    registry = CollectorRegistry()
    metrics.install(registry, database_gauges=False)
    try:
        Task.objects.ensure("x")
        assert registry.get_sample_value("taskclaim_tasks", {"status": "pending", "database": Task.objects.db}) is None
        Task.objects.claim("x")
        assert value(registry, "taskclaim_claims_total", outcome="claimed") == 1
    finally:
        metrics.uninstall(registry)


def test_metrics_view(registry) -> None:  # type: ignore[no-untyped-def]
    Task.objects.claim("v-1", lease=600)
    response = metrics.metrics_view(RequestFactory().get("/metrics"), registry=registry)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    body = response.content.decode()
    db = Task.objects.db
    assert f'taskclaim_claims_total{{database="{db}",outcome="claimed"}} 1.0' in body
    assert f'taskclaim_tasks{{database="{db}",status="running"}} 1.0' in body
    assert f'taskclaim_expired_leases{{database="{db}"}} 0.0' in body
    assert f'taskclaim_database_up{{database="{db}"}} 1.0' in body


def test_queue_depth_and_the_oldest_due_tasks_age_per_queue(registry) -> None:  # type: ignore[no-untyped-def]
    """Issue 24: what operators alert on, per queue: how many wait, and for how long."""
    import datetime as dt

    from django.utils import timezone

    for i in range(3):
        Task.objects.ensure(f"mail-{i}", queue="mail")
    Task.objects.ensure("mail-later", queue="mail", run_after=timezone.now() + dt.timedelta(hours=1))
    Task.objects.ensure("report", queue="reports")
    Task.objects.claim_next(queue="reports")
    Task.objects.ensure("by-key")  # not queued work: in no queue's figures
    Task.objects.filter(key="mail-0").update(created_at=timezone.now() - dt.timedelta(minutes=10))
    assert value(registry, "taskclaim_queue_depth", queue="mail", state="due") == 3
    assert value(registry, "taskclaim_queue_depth", queue="mail", state="deferred") == 1
    assert value(registry, "taskclaim_queue_depth", queue="reports", state="running") == 1
    assert value(registry, "taskclaim_queue_depth", queue="reports", state="due") == 0
    assert 590 < value(registry, "taskclaim_queue_oldest_due_seconds", queue="mail") < 900
    assert value(registry, "taskclaim_queue_oldest_due_seconds", queue="reports") == 0
    assert registry.get_sample_value("taskclaim_queue_depth",
                                     {"queue": "default", "state": "due", "database": Task.objects.db}) is None


def test_the_dashboard_s_figures_under_the_same_names(registry) -> None:  # type: ignore[no-untyped-def]
    """Parity (issue 45 item 4): every figure of the dashboard's groups and limits is a series of
    the same name, for both windows."""
    from django.test import override_settings

    from django_taskclaim import dashboard
    from django_taskclaim.schedules.spec import parse
    from django_taskclaim.schedules.status import standing

    for key in ("m1", "m2"):
        Task.objects.ensure(key, queue="mail", task_path="app.tasks.send")
    done, broken = sorted(Task.objects.claim_next(owner="w", limit=2, queue="mail", path="*"), key=lambda c: c.key)
    done.complete()
    broken.fail("down")
    stale = Task.objects.claim("k", owner="old", lease=60).claim
    expire(stale)
    Task.objects.claim("k", owner="new", lease=60)
    with pytest.raises(StaleClaim):
        stale.heartbeat()
    Task.objects.ensure("l1", queue="api", concurrency_key="partner", concurrency_limit=1)

    for name in dashboard.WINDOWS:
        groups = dashboard.window(name).groups
        assert {(g.queue, g.task_path) for g in groups} == {("mail", "app.tasks.send"), (None, "")}
        for g in groups:
            labels = {"window": name, "queue": g.queue or "", "task_path": g.task_path}
            for figure in dashboard.COUNTS:
                assert value(registry, f"taskclaim_window_{figure}", **labels) == getattr(g, figure), figure
            for q in dashboard.QUANTILES:
                assert value(registry, "taskclaim_window_wait_seconds", quantile=str(q), **labels) == g.wait[q]
            for q, seconds in g.run.items():
                assert value(registry, "taskclaim_window_run_seconds", quantile=str(q), **labels) == seconds
    by_key = {"window": "1h", "queue": "", "task_path": ""}
    assert value(registry, "taskclaim_window_started", **by_key) == 2
    assert value(registry, "taskclaim_window_takeovers", **by_key) == 1
    assert value(registry, "taskclaim_window_fenced_writes", **by_key) == 1
    mail = {"window": "1d", "queue": "mail", "task_path": "app.tasks.send"}
    assert value(registry, "taskclaim_window_succeeded", **mail) == 1
    assert value(registry, "taskclaim_window_failed", **mail) == 1
    assert value(registry, "taskclaim_limit_waiting", key="partner") == 1
    assert value(registry, "taskclaim_limit_running", key="partner") == 0

    schedules = {"beat": {"task": "tests.testapp.tasks.tick", "every": 60}}
    with override_settings(TASKCLAIM_SCHEDULES=schedules):
        expected = standing(parse("beat", schedules["beat"])).next_tick
        assert expected is not None
        got = registry.get_sample_value("taskclaim_schedule_next_tick_timestamp_seconds", {"schedule": "beat"})
        assert got == pytest.approx(expected.timestamp(), abs=61)


def test_without_window_gauges() -> None:
    registry = CollectorRegistry()
    metrics.install(registry, window_gauges=False)
    try:
        Task.objects.ensure("x")
        assert registry.get_sample_value("taskclaim_tasks", {"status": "pending", "database": Task.objects.db}) == 1
        assert "taskclaim_window_started" not in {m.name for m in registry.collect()}
    finally:
        metrics.uninstall(registry)
