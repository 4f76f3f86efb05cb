"""The Task admin for Django tasks: the task path (column, filter, search), a search by result
id, the queue overview, and cancel and retry buttons on a task's page."""

from __future__ import annotations

import datetime as dt

import pytest
from django.urls import reverse
from django.utils import timezone

from django_taskclaim.ids import parse_task_id, task_id
from django_taskclaim.models import Task
from django_taskclaim.status import Status
from tests.operators.test_admin import CHANGELIST, keys_listed, messages_of, staff
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

QUEUES = "admin:django_taskclaim_task_queues"


def change_url(task: Task) -> str:
    return reverse("admin:django_taskclaim_task_change", args=[task.pk])


@pytest.fixture
def django_tasks() -> dict[str, Task]:
    """Two unkeyed Django tasks (random keys), a handler's work and a task claimed by key."""
    add = tasks.add.enqueue(1, 2)
    mail = tasks.send_email.enqueue("a@example.com")
    Task.objects.ensure("for-a-handler", queue="default")
    Task.objects.ensure("by-key")
    return {"add": Task.objects.get(pk=parse_task_id(add.id)[1]),
            "mail": Task.objects.get(pk=parse_task_id(mail.id)[1]),
            "handler": Task.objects.get(key="for-a-handler"), "by-key": Task.objects.get(key="by-key")}


def test_the_list_shows_each_tasks_path(client, django_tasks) -> None:  # type: ignore[no-untyped-def]
    client.force_login(staff("viewer"))
    html = client.get(reverse(CHANGELIST)).content.decode()
    assert '<td class="field-task_path_display">tests.testapp.tasks.add</td>' in html
    assert '<td class="field-task_path_display">tests.testapp.tasks.send_email</td>' in html
    assert '<td class="field-task_path_display">(a handler)</td>' in html  # queued, no path


@pytest.mark.parametrize(("query", "expected"), [
    ({"task_path": "tests.testapp.tasks.add"}, {"add"}),
    ({"q": "tests.testapp.tasks.send_email"}, {"mail"}),
    ({"q": "send_email"}, {"mail"}),
])
def test_filter_and_search_by_task_path(client, django_tasks, query, expected) -> None:  # type: ignore[no-untyped-def]
    client.force_login(staff("viewer"))
    response = client.get(reverse(CHANGELIST), query)
    assert response.status_code == 200
    assert keys_listed(response) == {django_tasks[name].key for name in expected}


def test_the_task_path_filter_offers_the_paths_stored(client, django_tasks) -> None:  # type: ignore[no-untyped-def]
    client.force_login(staff("viewer"))
    response = client.get(reverse(CHANGELIST))
    [found] = [f for f in response.context["cl"].filter_specs if getattr(f, "parameter_name", "") == "task_path"]
    assert [value for value, _ in found.lookup_choices] == ["tests.testapp.tasks.add", "tests.testapp.tasks.send_email"]


def test_search_by_result_id(client, django_tasks) -> None:  # type: ignore[no-untyped-def]
    client.force_login(staff("viewer"))
    # A key, owner and path without digits: only the id can find it.
    task = Task.objects.ensure("no-digits-here", queue="default", task_path="tests.testapp.tasks.add")
    result_id = tasks.add.get_result(task_id(task._state.db, task.pk)).id
    assert keys_listed(client.get(reverse(CHANGELIST), {"q": result_id})) >= {task.key}
    assert keys_listed(client.get(reverse(CHANGELIST), {"q": "no-digits"})) == {task.key}


def test_a_tasks_page_shows_its_result_id_and_the_frameworks_status(client, django_tasks) -> None:  # type: ignore[no-untyped-def]
    client.force_login(staff("viewer"))
    add = django_tasks["add"]
    Task.objects.filter(pk=add.pk).cancel()
    html = client.get(change_url(add)).content.decode()
    assert f'<div class="readonly">{task_id(add._state.db, add.pk)}</div>' in html  # its result id
    assert '<div class="readonly">FAILED (cancelled)</div>' in html


def test_the_queue_overview(client, django_tasks) -> None:  # type: ignore[no-untyped-def]
    client.force_login(staff("viewer"))
    Task.objects.ensure("later", queue="emails", run_after=timezone.now() + dt.timedelta(hours=1),
                        task_path="tests.testapp.tasks.send_email")
    [claim] = Task.objects.claim_next(queue="emails", path="*")
    assert claim.task_id == django_tasks["mail"].pk
    listing = client.get(reverse(CHANGELIST)).content.decode()
    assert f'href="{reverse(QUEUES)}"' in listing  # linked from the list
    response = client.get(reverse(QUEUES))
    assert response.status_code == 200
    rows = {(r["database"], r["queue"]): r for r in response.context["queues"]}
    assert rows[("default", "default")]["due"] == 2 and rows[("default", "default")]["running"] == 0
    assert rows[("default", "emails")]["deferred"] == 1 and rows[("default", "emails")]["running"] == 1
    assert rows[("default", "default")]["oldest_due_age"] is not None
    html = response.content.decode()
    assert "<th>Oldest waiting</th>" in html and "<td>emails</td>" in html


def test_the_queue_overview_needs_the_view_permission(client, django_tasks) -> None:  # type: ignore[no-untyped-def]
    from django.contrib.auth.models import User

    client.force_login(User.objects.create(username="nobody", is_staff=True))
    assert client.get(reverse(QUEUES)).status_code == 403


def test_cancel_and_retry_buttons(client, django_tasks) -> None:  # type: ignore[no-untyped-def]
    client.force_login(staff("operator", "cancel_task", "reset_task"))
    add = django_tasks["add"]
    page = client.get(change_url(add)).content.decode()
    cancel = reverse("admin:django_taskclaim_task_cancel", args=[add.pk])
    retry = reverse("admin:django_taskclaim_task_retry", args=[add.pk])
    assert f'action="{cancel}' in page and f'action="{retry}' not in page  # only what applies
    assert client.get(cancel).status_code == 405  # a GET changes nothing
    response = client.post(cancel, follow=True)
    named = task_id(add._state.db, add.pk)
    assert messages_of(response) == [f"Cancelled task {named}."]
    add.refresh_from_db()
    assert add.status == Status.CANCELLED
    page = client.get(change_url(add)).content.decode()
    assert f'action="{retry}' in page and f'action="{cancel}' not in page
    response = client.post(retry, follow=True)
    assert messages_of(response) == [f"Task {named} is pending again, its attempts counted afresh."]
    add.refresh_from_db()
    assert add.status == Status.PENDING
    # A task that is not in a state the button applies to (a stale page): refused, named, unchanged.
    response = client.post(retry, follow=True)
    assert messages_of(response) == [f"Task {named} is pending: only a failed or cancelled task can be retried."]


def test_the_buttons_need_their_permissions(client, django_tasks) -> None:  # type: ignore[no-untyped-def]
    client.force_login(staff("viewer"))
    add = django_tasks["add"]
    assert "cancel/" not in client.get(change_url(add)).content.decode()
    assert client.post(reverse("admin:django_taskclaim_task_cancel", args=[add.pk])).status_code == 403
    Task.objects.filter(pk=add.pk).cancel()
    assert client.post(reverse("admin:django_taskclaim_task_retry", args=[add.pk])).status_code == 403
    add.refresh_from_db()
    assert add.status == Status.CANCELLED
