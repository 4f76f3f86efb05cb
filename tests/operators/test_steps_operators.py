"""What operators see of a task's durable steps: the admin's task page and ``taskclaim_inspect``."""

from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.urls import reverse

from django_taskclaim.models import Task
from tests.conftest import expire

pytestmark = pytest.mark.django_db


@pytest.fixture
def stepped() -> Task:
    """A task whose first owner stored one step and died; the second stored another and completed."""
    first = Task.objects.claim("agent-run", owner="w1").claim
    assert first
    first.step("call-1", lambda: {"text": "draft <b>one</b>"})
    expire(first)
    second = Task.objects.claim("agent-run", owner="w2").claim
    assert second
    second.step("call-1", lambda: "never called")
    second.step("call-2", lambda: "x" * 300)
    second.complete("published")
    return Task.objects.get(key="agent-run")


def test_the_admin_shows_a_tasks_steps_read_only(client, stepped) -> None:  # type: ignore[no-untyped-def]
    viewer = User.objects.create(username="viewer", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(content_type__app_label="django_taskclaim",
                                                          codename="view_task"))
    client.force_login(viewer)
    response = client.get(reverse("admin:django_taskclaim_task_change", args=[stepped.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Steps (stored results)" in html
    assert "call-1" in html and "call-2" in html
    assert "draft &lt;b&gt;one&lt;/b&gt;" in html  # escaped
    assert "<details>" in html  # the long result folded
    assert 'name="step_set-0-name"' not in html  # read-only: no form fields


def test_inspect_shows_a_tasks_steps(stepped) -> None:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    call_command("taskclaim_inspect", "agent-run", stdout=out)
    lines = out.getvalue().split("steps (2, stored results):")[1].strip().splitlines()
    assert "token    1" in lines[0] and "'call-1'" in lines[0] and '{"text": "draft <b>one</b>"}' in lines[0]
    assert "token    2" in lines[1] and "'call-2'" in lines[1] and lines[1].endswith("…")
    out = io.StringIO()
    call_command("taskclaim_inspect", "agent-run", "--json", stdout=out)
    steps = json.loads(out.getvalue())["steps"]
    assert [(s["name"], s["token"]) for s in steps] == [("call-1", 1), ("call-2", 2)]
    assert steps[0]["result"] == {"text": "draft <b>one</b>"} and steps[0]["stored_at"]
