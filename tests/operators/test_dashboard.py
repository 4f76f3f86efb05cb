"""The admin's dashboard (``admin:django_taskclaim_dashboard``) with the Django test client: who may
see it, and that its figures and charts are the database's."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_taskclaim.dashboard import BOUNDS, quantile, window
from django_taskclaim.exceptions import StaleClaim
from django_taskclaim.models import Task
from tests.conftest import expire

pytestmark = pytest.mark.django_db

DASHBOARD = "admin:django_taskclaim_dashboard"
MAIL = "mail · app.tasks.send"


def staff(username: str, *codenames: str) -> User:
    user = User.objects.create(username=username, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_taskclaim",
                                                        codename__in=codenames))
    return user


@pytest.fixture
def work() -> None:
    """Queued work that succeeded, failed and still runs, and a task claimed by key taken over,
    whose stale owner then had a write refused."""
    for key in ("a1", "a2", "a3"):
        Task.objects.ensure(key, queue="mail", task_path="app.tasks.send")
    done, broken, running = sorted(Task.objects.claim_next(owner="w1", limit=3, queue="mail", path="*"),
                                   key=lambda c: c.key)
    done.complete("sent")
    broken.fail("smtp down")
    running.progress(0.5, "half way")
    stale = Task.objects.claim("k1", owner="old", lease=60).claim
    expire(stale)
    assert Task.objects.claim("k1", owner="new", lease=60).claimed
    with pytest.raises(StaleClaim):
        stale.check()
    Task.objects.ensure("limited-1", queue="api", concurrency_key="partner", concurrency_limit=1)
    Task.objects.ensure("limited-2", queue="api", concurrency_key="partner", concurrency_limit=1)


def test_only_staff_with_the_task_view_permission_see_it(client) -> None:  # type: ignore[no-untyped-def]
    url = reverse(DASHBOARD)
    assert url.endswith("/django_taskclaim/task/dashboard/")
    assert client.get(url).status_code == 302  # anonymous: to the login page
    client.force_login(User.objects.create(username="member"))  # not staff
    assert client.get(url).status_code == 302
    client.force_login(staff("no-view", "reset_task"))
    assert client.get(url).status_code == 403
    client.force_login(staff("viewer", "view_task"))
    assert client.get(url).status_code == 200


def test_the_figures_are_the_attempts_of_the_window(client, work) -> None:  # type: ignore[no-untyped-def]
    client.force_login(staff("viewer", "view_task"))
    response = client.get(reverse(DASHBOARD))
    assert response.status_code == 200
    assert response.context["totals"] == {"started": 5, "succeeded": 1, "failed": 1, "takeovers": 1,
                                          "fenced_writes": 1}
    groups = {row["group"].label: row["group"] for row in response.context["groups"]}
    assert set(groups) == {MAIL, "(by key)"}
    mail, by_key = groups[MAIL], groups["(by key)"]
    assert (mail.started, mail.succeeded, mail.failed, mail.takeovers) == (3, 1, 1, 0)
    assert (by_key.started, by_key.takeovers, by_key.fenced_writes) == (2, 1, 1)
    assert set(mail.wait) == {0.5, 0.95} and 0 <= mail.wait[0.5] <= mail.wait[0.95]
    assert set(mail.run) == {0.5, 0.95}  # two attempts ended

    html = response.content.decode()
    # The charts carry the same figures, drawn as SVG with their values.
    assert re.search(r'data-chart="per-group"', html)
    assert f'data-series="succeeded" data-value="1" data-group="{MAIL}"' in html
    assert f'data-series="failed" data-value="1" data-group="{MAIL}"' in html
    bars = re.findall(r'data-chart="over-time".*?</svg>', html, re.S)[0]
    assert sum(int(v) for v in re.findall(r'data-series="\w+" data-value="(\d+)"', bars)) == 5
    assert 'data-chart="wait"' in html and 'data-chart="run"' in html
    # The running tasks with their owner, token and progress, linked to their page.
    running = re.findall(r'<table id="running">.*?</table>', html, re.S)[0]
    a3 = Task.objects.get(key="a3")
    assert reverse("admin:django_taskclaim_task_change", args=[a3.pk]) in running
    assert "50% half way (token 1)" in running and "w1" in running
    # The limits' waiting tasks; the task list of each group.
    limits = re.findall(r'<table id="limits">.*?</table>', html, re.S)[0]
    assert re.search(r"<td>partner</td><td>1</td><td>0</td><td>2</td>", limits)
    assert "?queue__exact=mail&amp;task_path=app.tasks.send" in html


def test_the_day_window_and_an_unknown_one(client, work) -> None:  # type: ignore[no-untyped-def]
    client.force_login(staff("viewer", "view_task"))
    day = client.get(reverse(DASHBOARD), {"window": "1d"})
    assert day.context["window"].name == "1d" and day.context["totals"]["started"] == 5
    assert len(day.context["window"].series) == 24
    odd = client.get(reverse(DASHBOARD), {"window": "<script>"})
    assert odd.status_code == 200 and odd.context["window"].name == "1h"
    assert "<script>" not in odd.content.decode()


def test_the_window_counts_nothing_older(work) -> None:  # type: ignore[no-untyped-def]
    from django_taskclaim.models import Attempt
    from django_taskclaim.store import DbNowPlus

    Attempt.objects.update(started_at=DbNowPlus(-2 * 3600))
    assert window("1h").groups == []
    assert window("1d").total("started") == 5


def test_quantiles_from_counts_under_the_bounds() -> None:
    # Ten values: four under 0.01 s, six between 1 and 2.5 s.
    counts = [4 if b <= 0.01 else 4 if b <= 1 else 10 for b in BOUNDS]
    assert quantile(counts, 10, 0.4) == pytest.approx(0.01)
    assert quantile(counts, 10, 0.7) == pytest.approx(1 + 1.5 * 0.5)
    assert quantile(counts, 10, 0.95) == pytest.approx(1 + 1.5 * (5.5 / 6))
    assert quantile([0] * len(BOUNDS), 3, 0.5) == BOUNDS[-1]  # all above the last bound
    assert quantile([0] * len(BOUNDS), 0, 0.5) is None


@pytest.mark.django_db(transaction=True)
def test_the_window_queries_run_without_jit_on_postgresql_and_leave_the_session_as_it_was() -> None:
    from django.db import connection

    from django_taskclaim.dashboard import reporting

    if connection.vendor != "postgresql":
        pytest.skip("JIT is PostgreSQL's")
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        before = cursor.fetchone()[0]
        with reporting(connection.alias):
            cursor.execute("SHOW jit")
            assert cursor.fetchone()[0] == "off"
        cursor.execute("SHOW jit")
        assert cursor.fetchone()[0] == before


def test_the_quantiles_fall_in_the_bucket_of_the_times_measured(work) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from django.db.models import F

    from django_taskclaim.models import Attempt

    # The two ended attempts of the mail group ran 3 s; their tasks were due 40 s before they started.
    mail = Attempt.objects.filter(task__queue="mail")
    mail.filter(ended_at__isnull=False).update(ended_at=F("started_at") + timedelta(seconds=3))
    for attempt in mail:
        Task.objects.filter(pk=attempt.task_id).update(created_at=attempt.started_at - timedelta(seconds=40))
    [group] = [g for g in window("1h").groups if g.queue == "mail"]
    assert 2.5 < group.run[0.5] <= group.run[0.95] <= 5
    assert 30 < group.wait[0.5] <= group.wait[0.95] <= 60
