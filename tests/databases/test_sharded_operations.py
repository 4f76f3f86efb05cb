"""Operating Django tasks over two task databases: ids name the database (``shard2:42``) in the
backend's cancel and retry, ``taskclaim_inspect --id``, the admin's buttons, search and queue
overview, and the log lines."""

from __future__ import annotations

import io
import json
import logging

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.urls import reverse

from django_taskclaim.models import Task
from django_taskclaim.status import Status
from django_taskclaim.tasks.compat import TaskResultStatus, task_backends
from tests.sharding import ON_B, SHARDED_TESTS, B

pytestmark = SHARDED_TESTS

PATH = "tests.testapp.tasks.add"


def on_b(key: str = "add-on-b", queue: str = "default") -> Task:
    """A Django task (``add(1, 2)``) of a tenant whose tasks are in the second database."""
    return Task.objects.ensure(key, tenant=ON_B[0], payload={"args": [1, 2], "kwargs": {}}, queue=queue,
                               task_path=PATH)


def test_the_backend_cancels_and_retries_a_task_of_the_second_database() -> None:
    task = on_b()
    assert task._state.db == B
    backend = task_backends["default"]
    assert backend.cancel(f"{B}:{task.pk}").status == TaskResultStatus.FAILED
    assert Task.objects.db_manager(B).get(pk=task.pk).status == Status.CANCELLED
    assert backend.retry(f"{B}:{task.pk}").status == TaskResultStatus.READY


def test_inspect_by_id_names_the_database_and_a_bare_key_is_refused() -> None:
    task = on_b()
    out = io.StringIO()
    call_command("taskclaim_inspect", "--id", f"{B}:{task.pk}", "--json", stdout=out)
    doc = json.loads(out.getvalue())
    assert doc["database"] == B and doc["result_id"] == f"{B}:{task.pk}" and doc["task"]["key"] == "add-on-b"
    several = rf"with several task databases a task id is alias:pk .*{B}:{task.pk}"
    with pytest.raises(CommandError, match=several) as info:
        call_command("taskclaim_inspect", "--id", str(task.pk), stdout=io.StringIO())
    assert info.value.returncode == 2
    out = io.StringIO()
    call_command("taskclaim_inspect", "--id", str(task.pk), "--database", B, "--json", stdout=out)
    assert json.loads(out.getvalue())["task"]["key"] == "add-on-b"


def test_the_admin_on_the_second_database(client) -> None:  # type: ignore[no-untyped-def]
    user = User.objects.create(username="op", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_taskclaim",
                                                        codename__in=["view_task", "cancel_task"]))
    client.force_login(user)
    task = on_b()
    Task.objects.ensure("on-a", queue="emails", task_path=PATH)
    rows = {(r["database"], r["queue"]) for r in
            client.get(reverse("admin:django_taskclaim_task_queues")).context["queues"]}
    assert rows == {("default", "emails"), (B, "default")}
    listing = client.get(reverse("admin:django_taskclaim_task_changelist"), {"database": B, "q": f"{B}:{task.pk}"})
    assert [t.key for t in listing.context["cl"].result_list] == ["add-on-b"]
    page = client.get(reverse("admin:django_taskclaim_task_change", args=[task.pk]), {"database": B})
    cancel = reverse("admin:django_taskclaim_task_cancel", args=[task.pk]) + f"?database={B}"
    assert f'action="{cancel}"' in page.content.decode()
    response = client.post(cancel, follow=True)
    assert [str(m) for m in response.context["messages"]] == [f"Cancelled task {B}:{task.pk}."]
    assert Task.objects.db_manager(B).get(pk=task.pk).status == Status.CANCELLED


def test_log_lines_name_the_database_in_the_id(caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="django_taskclaim")
    task = on_b()
    [claim] = Task.objects.claim_next(path="*", owner="w1", tenant=ON_B[0])
    claim.complete(3)
    messages = [r.getMessage() for r in caplog.records if r.getMessage().startswith("task completed")]
    assert messages == [f"task completed: {PATH} id={B}:{task.pk} key='add-on-b' tenant={ON_B[0]!r} token=1 "
                        "owner='w1'"]


def log_in_viewer(client) -> None:  # type: ignore[no-untyped-def]
    """Log ``client`` in as staff with the task model's view permission alone (the operator pages)."""
    user = User.objects.create(username="viewer", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_taskclaim",
                                                        codename="view_task"))
    client.force_login(user)


def test_the_queue_overview_names_a_database_it_cannot_reach_and_shows_the_others(client) -> None:  # type: ignore[no-untyped-def]
    from django.db import connections

    from devtools.servers import free_port

    log_in_viewer(client)
    on_b()
    Task.objects.ensure("on-a", queue="emails", task_path=PATH)
    conn = connections[B]
    conn.close()
    saved = conn.settings_dict["PORT"]
    conn.settings_dict["PORT"] = str(free_port())  # nothing listens there: the server is down
    try:
        response = client.get(reverse("admin:django_taskclaim_task_queues"))
    finally:
        conn.settings_dict["PORT"] = saved
        conn.close()
    assert response.status_code == 200
    assert [(r["database"], r["queue"]) for r in response.context["queues"]] == [("default", "emails")]
    assert list(response.context["unreachable"]) == [B]
    assert f"Task database {B} cannot be reached: " in response.content.decode()


def test_the_dashboard_counts_both_databases_and_names_one_it_cannot_reach(client) -> None:  # type: ignore[no-untyped-def]
    from django.db import connections

    from devtools.servers import free_port

    log_in_viewer(client)
    on_b()
    Task.objects.ensure("on-a", queue="emails", task_path=PATH)
    [on_a] = Task.objects.claim_next(path="*", owner="w1", queue="emails")
    on_a.complete(3)
    [b] = Task.objects.claim_next(path="*", owner="w2", tenant=ON_B[0])
    b.progress(0.5, "half")
    page = client.get(reverse("admin:django_taskclaim_dashboard"))
    groups = {(row["group"].database, row["group"].queue, row["group"].succeeded) for row in page.context["groups"]}
    assert groups == {("default", "emails", 1), (B, "default", 0)}
    running = page.context["running"]
    assert [(r["database"], r["progress"]) for r in running] == [(B, "50% half (token 1)")]
    assert f"?database={B}" in running[0]["url"]
    conn = connections[B]
    conn.close()
    saved = conn.settings_dict["PORT"]
    conn.settings_dict["PORT"] = str(free_port())  # nothing listens there: the server is down
    try:
        response = client.get(reverse("admin:django_taskclaim_dashboard"))
    finally:
        conn.settings_dict["PORT"] = saved
        conn.close()
    assert response.status_code == 200
    assert [(r["group"].database, r["group"].queue) for r in response.context["groups"]] == [("default", "emails")]
    assert list(response.context["unreachable"]) == [B]
    assert f"Task database {B} cannot be reached: " in response.content.decode()
