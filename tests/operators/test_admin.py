"""The Task admin with the Django test client: list, filters, search, actions, permissions."""

from __future__ import annotations

import logging

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_taskclaim.admin import human_seconds
from django_taskclaim.exceptions import StaleClaim
from django_taskclaim.models import Attempt, Task
from tests.conftest import expire

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_taskclaim_task_changelist"


def staff(username: str, *codenames: str) -> User:
    user = User.objects.create(username=username, is_staff=True)
    perms = Permission.objects.filter(content_type__app_label="django_taskclaim",
                                      codename__in=["view_task", *codenames])
    assert perms.count() == 1 + len(codenames)
    user.user_permissions.set(perms)
    return user


@pytest.fixture
def viewer(client):  # type: ignore[no-untyped-def]
    client.force_login(staff("viewer"))
    return client


@pytest.fixture
def operator(client):  # type: ignore[no-untyped-def]
    perms = ("reclaim_task", "release_task", "reset_task", "cancel_task")
    client.force_login(staff("operator", *perms))
    return client


def keys_listed(response) -> set[str]:  # type: ignore[no-untyped-def]
    return {task.key for task in response.context["cl"].result_list}


def act(client, action: str, *tasks: Task):  # type: ignore[no-untyped-def]
    data = {"action": action, "index": 0, "_selected_action": [t.pk for t in tasks]}
    return client.post(reverse(CHANGELIST), data, follow=True)


def messages_of(response) -> list[str]:  # type: ignore[no-untyped-def]
    return [str(m) for m in response.context["messages"]]


@pytest.fixture
def states() -> dict[str, Task]:
    """One task in each interesting state."""
    Task.objects.ensure("pending-1")
    live = Task.objects.claim("running-live", owner="alice", lease=600).claim
    old = Task.objects.claim("running-expired", owner="bob", lease=600).claim
    expire(old)
    done = Task.objects.claim("done", owner="carol", tenant="acme").claim
    done.complete({"answer": 42})
    failed = Task.objects.claim("broken", owner="dave").claim
    failed.fail(RuntimeError("disk full"))
    taken = Task.objects.claim("taken", owner="erin", lease=600).claim
    expire(taken)
    Task.objects.claim("taken", owner="frank", lease=600)
    assert live and old and done and failed and taken
    return {t.key: t for t in Task.objects.all()}


def test_changelist_shows_state_columns(viewer, states) -> None:  # type: ignore[no-untyped-def]
    response = viewer.get(reverse(CHANGELIST))
    assert response.status_code == 200
    html = response.content.decode()
    assert keys_listed(response) == set(states)
    assert "alice" in html and "acme" in html
    assert "42" in html  # the result preview
    assert "RuntimeError: disk full" in html
    assert "left" in html and "expired" in html and " ago" in html  # lease by the database clock
    assert "0/5" in html and "1/5" in html and "2/5" in html


def test_lease_column_by_database_clock(viewer, states) -> None:  # type: ignore[no-untyped-def]
    response = viewer.get(reverse(CHANGELIST))
    rows = {t.key: t for t in response.context["cl"].result_list}
    admin = response.context["cl"].model_admin
    assert admin.lease(rows["running-live"]).endswith("left")
    assert admin.lease(rows["running-live"]).startswith("9m")  # 600 s lease, just claimed
    assert admin.lease(rows["running-expired"]).startswith("expired ")
    assert admin.lease(rows["done"]) == "-"
    assert admin.took_over(rows["taken"]) and not admin.took_over(rows["running-live"])


def test_human_seconds() -> None:
    assert human_seconds(0) == "0s"
    assert human_seconds(95) == "1m 35s"
    assert human_seconds(-3600 * 26 - 5) == "1d 2h"


@pytest.mark.parametrize(("query", "expected"), [
    ({"status__exact": "running"}, {"running-live", "running-expired", "taken"}),
    ({"status__exact": "succeeded"}, {"done"}),
    ({"lease": "expired"}, {"running-expired"}),
    ({"lease": "live"}, {"running-live", "taken"}),
    ({"takeovers": "yes"}, {"taken"}),
    ({"tenant": "acme"}, {"done"}),
    ({"q": "running-"}, {"running-live", "running-expired"}),
    ({"q": "frank"}, {"taken"}),
    ({"q": "ali"}, {"running-live"}),
])
def test_filters_and_search(viewer, states, query, expected) -> None:  # type: ignore[no-untyped-def]
    response = viewer.get(reverse(CHANGELIST), query)
    assert response.status_code == 200
    assert keys_listed(response) == expected


def test_takeover_filter_no(viewer, states) -> None:  # type: ignore[no-untyped-def]
    response = viewer.get(reverse(CHANGELIST), {"takeovers": "no"})
    assert keys_listed(response) == set(states) - {"taken"}


def test_changelist_query_count_does_not_grow_with_rows(viewer) -> None:  # type: ignore[no-untyped-def]
    def count_queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert viewer.get(reverse(CHANGELIST)).status_code == 200
        return len(ctx.captured_queries)

    for i in range(3):
        Task.objects.claim(f"few-{i}", lease=600, owner=f"w{i}")
    few = count_queries()
    for i in range(40):
        c = Task.objects.claim(f"many-{i}", lease=600, owner=f"w{i}", tenant=f"t{i % 3}").claim
        if i % 2:
            expire(c)
            Task.objects.claim(f"many-{i}", lease=600, owner="taker", tenant=f"t{i % 3}")
            Task.objects.claim(f"many-{i}", owner="dup", tenant=f"t{i % 3}")
    many = count_queries()
    assert many == few, "the changelist runs a query per row"
    # session, user, permissions, filtered count, the queue, task path and tenant filters' values, the page
    assert many <= 10


def test_change_view_is_read_only_with_attempt_timeline(operator, states) -> None:  # type: ignore[no-untyped-def]
    task = states["taken"]
    response = operator.get(reverse("admin:django_taskclaim_task_change", args=[task.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    assert "erin" in html and "frank" in html  # both attempts inline
    assert "Lease expired (taken over)" in html
    assert 'name="key"' not in html and 'name="status"' not in html
    assert response.context["has_change_permission"] is False
    # A POST to the change view cannot write anything.
    operator.post(reverse("admin:django_taskclaim_task_change", args=[task.pk]),
                  {"status": "succeeded", "key": "x"})
    task.refresh_from_db()
    assert task.status == "running" and task.key == "taken"


def test_no_add_no_delete(operator, states) -> None:  # type: ignore[no-untyped-def]
    assert operator.get(reverse("admin:django_taskclaim_task_add")).status_code == 403
    response = operator.get(reverse(CHANGELIST))
    actions = {value for value, _label in response.context["action_form"].fields["action"].choices}
    assert actions == {"", "reclaim_expired", "release", "reset", "cancel"}
    before = Task.objects.count()
    act(operator, "delete_selected", states["done"])
    assert Task.objects.count() == before


def test_viewer_sees_state_and_cannot_act(viewer, states) -> None:  # type: ignore[no-untyped-def]
    response = viewer.get(reverse(CHANGELIST))
    assert response.context["action_form"] is None or not [
        c for c, _ in response.context["action_form"].fields["action"].choices if c]
    assert 'name="action"' not in response.content.decode()
    for action in ("release", "reclaim_expired", "cancel"):
        act(viewer, action, states["running-live"], states["running-expired"])
    act(viewer, "reset", states["broken"])
    assert Task.objects.get(key="running-live").status == "running"
    assert Task.objects.get(key="running-expired").status == "running"
    assert Task.objects.get(key="broken").status == "failed"


@pytest.mark.parametrize(("codename", "action"), [
    ("reclaim_task", "reclaim_expired"), ("release_task", "release"),
    ("reset_task", "reset"), ("cancel_task", "cancel"),
])
def test_each_action_needs_its_own_permission(client, codename, action) -> None:  # type: ignore[no-untyped-def]
    client.force_login(staff("one", codename))
    response = client.get(reverse(CHANGELIST))
    actions = [c for c, _ in response.context["action_form"].fields["action"].choices if c]
    assert actions == [action]


def test_release_action_fences_off_the_owner(operator) -> None:  # type: ignore[no-untyped-def]
    a = Task.objects.claim("rel-a", owner="a", lease=600).claim
    b = Task.objects.claim("rel-b", owner="b", lease=600).claim
    idle = Task.objects.ensure("rel-idle")
    response = act(operator, "release", Task.objects.get(key="rel-a"),
                   Task.objects.get(key="rel-b"), idle)
    assert "Released 2 tasks; their owners are fenced off." in messages_of(response)
    assert "1 selected task was skipped: not running." in messages_of(response)
    for old in (a, b):
        assert old is not None
        assert Task.objects.get(pk=old.task_id).status == "pending"
        with pytest.raises(StaleClaim):
            old.complete("late")
        with pytest.raises(StaleClaim):
            old.heartbeat()
    assert Attempt.objects.get(task_id=a.task_id, token=a.token).outcome == "released"
    # The next claim gets a larger token.
    again = Task.objects.claim("rel-a", owner="c").claim
    assert again is not None and again.token > a.token


def test_release_one_message_singular_and_logged(operator, caplog) -> None:  # type: ignore[no-untyped-def]
    Task.objects.claim("rel-one", lease=600)
    with caplog.at_level(logging.INFO, logger="django_taskclaim"):
        response = act(operator, "release", Task.objects.get(key="rel-one"))
    assert messages_of(response) == ["Released 1 task; its owner is fenced off."]
    logged = [r for r in caplog.records if r.getMessage().startswith("operator action")]
    assert len(logged) == 1
    assert (logged[0].user, logged[0].action, logged[0].count) == (  # type: ignore[attr-defined]
        "operator", "release", 1)


def test_reclaim_action(operator) -> None:  # type: ignore[no-untyped-def]
    old = Task.objects.claim("rc-old", lease=600).claim
    expire(old)
    last = Task.objects.claim("rc-last", lease=600, max_attempts=1).claim
    expire(last)
    live = Task.objects.claim("rc-live", lease=600).claim
    assert old and last and live
    response = act(operator, "reclaim_expired", Task.objects.get(key="rc-live"))
    assert messages_of(response) == [
        "Reclaimed 2 expired tasks: 1 back to pending, 1 failed (no attempts left)."]
    assert Task.objects.get(key="rc-old").status == "pending"
    assert Task.objects.get(key="rc-last").status == "failed"
    assert Task.objects.get(key="rc-live").status == "running"
    with pytest.raises(StaleClaim):
        old.complete()
    live.complete()


def test_reset_action(operator) -> None:  # type: ignore[no-untyped-def]
    failed = Task.objects.claim("rs-failed").claim
    assert failed
    failed.fail("nope")
    Task.objects.ensure("rs-cancelled")
    Task.objects.filter(key="rs-cancelled").cancel()
    ok = Task.objects.claim("rs-ok").claim
    assert ok
    ok.complete(1)
    response = act(operator, "reset", *Task.objects.filter(key__startswith="rs-"))
    assert "Reset 2 tasks to pending." in messages_of(response)
    assert "1 selected task was skipped: not failed or cancelled." in messages_of(response)
    assert dict(Task.objects.filter(key__startswith="rs-").values_list("key", "status")) == {
        "rs-failed": "pending", "rs-cancelled": "pending", "rs-ok": "succeeded"}
    assert Task.objects.get(key="rs-failed").attempts == 0


def test_cancel_action(operator) -> None:  # type: ignore[no-untyped-def]
    running = Task.objects.claim("cn-running", lease=600).claim
    assert running
    Task.objects.ensure("cn-pending")
    done = Task.objects.claim("cn-done").claim
    assert done
    done.complete()
    response = act(operator, "cancel", *Task.objects.filter(key__startswith="cn-"))
    assert "Cancelled 2 tasks." in messages_of(response)
    assert "1 selected task was skipped: already finished." in messages_of(response)
    assert Task.objects.get(key="cn-running").status == "cancelled"
    assert Task.objects.get(key="cn-done").status == "succeeded"
    with pytest.raises(StaleClaim):
        running.complete()
    # A cancelled task is terminal: a new delivery does not run it.
    assert not Task.objects.claim("cn-running").claimed


def test_attempt_links_to_celery_result(operator, settings) -> None:  # type: ignore[no-untyped-def]
    """Runs where the test settings install django-celery-results (the Celery bridge's tests)."""
    from django.apps import apps

    if not apps.is_installed("django_celery_results"):
        from tests.conftest import requirement_missing

        requirement_missing("django-celery-results (in INSTALLED_APPS)")
    from django_celery_results.models import TaskResult

    stored = TaskResult.objects.create(task_id="celery-id-1", status="SUCCESS")
    Task.objects.claim("linked", delivery_id="celery-id-1")
    Task.objects.claim("linked", delivery_id="celery-id-2")  # duplicate, no stored result yet
    task = Task.objects.get(key="linked")
    page = operator.get(reverse("admin:django_taskclaim_task_change", args=[task.pk]))
    html = page.content.decode()
    stored_url = reverse("admin:django_celery_results_taskresult_change", args=[stored.pk])
    assert f'href="{stored_url}"' in html
    search_url = reverse("admin:django_celery_results_taskresult_changelist") + "?q=celery-id-2"
    assert f'href="{search_url}"' in html


def test_changelist_shows_results_as_json(viewer, states) -> None:  # type: ignore[no-untyped-def]
    """Like the task page: JSON text, not Python's repr of the loaded value."""
    Task.objects.filter(key="done").update(result={"ok": [True, None, "é"]})
    html = viewer.get(reverse(CHANGELIST)).content.decode()
    cell = html.split('class="field-result_display">')[1:]
    shown = [c.split("</td>")[0] for c in cell]
    assert "{&quot;ok&quot;: [true, null, &quot;é&quot;]}" in shown, shown


def counts_in(queries: list[dict[str, str]]) -> list[str]:
    return [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]


def test_changelist_of_a_large_table_spares_the_count(viewer) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL: an unfiltered list of a large table is counted from the planner's statistics,
    without COUNT(*); a filtered one (and SQLite) counts exactly."""
    from django_taskclaim.admin import ESTIMATE_ABOVE

    rows = ESTIMATE_ABOVE + 500
    key = connection.ops.quote_name("key")
    name = "CONCAT('bulk-', n)" if connection.vendor == "mysql" else "'bulk-' || n"
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":  # the recursive CTE below counts past their default limits
            limit = "max_recursive_iterations" if connection.mysql_is_mariadb else "cte_max_recursion_depth"
            cursor.execute(f"SET SESSION {limit} = %s", [rows + 1])
        cursor.execute(
            f"INSERT INTO django_taskclaim_task (tenant, {key}, status, owner, fencing_token, attempts, "  # noqa: S608 (quoted column, fixed SQL)
            f"max_attempts, payload_fingerprint, result_ref, error, created_at, updated_at, priority, task_path) "
            f"SELECT 'bulk', {name}, 'pending', '', 0, 0, 5, '', '', '', %s, %s, 0, '' "
            f"FROM (WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < %s) "
            f"SELECT n FROM s) AS numbers",
            [now, now, rows])
        if connection.vendor == "postgresql":
            cursor.execute("ANALYZE django_taskclaim_task")
    with CaptureQueriesContext(connection) as ctx:
        response = viewer.get(reverse(CHANGELIST))
    assert response.status_code == 200
    if connection.vendor == "postgresql":
        assert counts_in(ctx.captured_queries) == []
        assert abs(response.context["cl"].result_count - rows) < rows * 0.1  # an estimate
    else:
        assert len(counts_in(ctx.captured_queries)) == 1
        assert response.context["cl"].result_count == rows
    with CaptureQueriesContext(connection) as ctx:
        response = viewer.get(reverse(CHANGELIST), {"status__exact": "pending"})
    assert len(counts_in(ctx.captured_queries)) == 1 and response.context["cl"].result_count == rows


def test_the_admin_shows_queue_priority_not_before_path_and_each_attempts_traceback(operator) -> None:  # type: ignore[no-untyped-def]
    import datetime as dt

    from django.utils import timezone

    later = timezone.now() + dt.timedelta(hours=2)
    Task.objects.ensure("queued", queue="mail", priority=7, run_after=later, task_path="shop.tasks.send")
    Task.objects.filter(key="queued").update(run_after=timezone.now() - dt.timedelta(seconds=1))
    [claim] = Task.objects.claim_next(queue="mail", path="*")
    try:
        raise ValueError("smtp down")
    except ValueError as exc:
        claim.fail(exc, retry=True)
    listing = operator.get(reverse(CHANGELIST), {"queue": "mail"})
    assert keys_listed(listing) == {"queued"}
    html = listing.content.decode()
    assert ">mail<" in html and ">7<" in html
    task = Task.objects.get(key="queued")
    page = operator.get(reverse("admin:django_taskclaim_task_change", args=[task.pk])).content.decode()
    assert "shop.tasks.send" in page and "Not before" in page
    assert "<details><summary>ValueError: smtp down</summary>" in page
    assert 'raise ValueError(&quot;smtp down&quot;)' in page  # the traceback, escaped
