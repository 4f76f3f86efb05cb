"""``taskclaim_inspect --id``: one task by its id (a Django task's result id, ``alias:pk`` or
``pk``), with the status Django's Tasks framework reports for it."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from django_taskclaim.conf import settings
from django_taskclaim.models import Task
from django_taskclaim.routing import several
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("taskclaim_inspect", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def fails(*args: str) -> CommandError:
    with pytest.raises(CommandError) as info:
        call_command("taskclaim_inspect", *args, stdout=io.StringIO(), stderr=io.StringIO())
    return info.value


def test_inspect_a_django_task_by_its_result_id() -> None:
    result = tasks.add.enqueue(1, 2)
    Task.objects.filter(pk=int(result.id.rpartition(":")[2])).cancel()
    text = run("--id", result.id)
    assert text.startswith(f"task {Task.objects.get().key!r} tenant=''")
    assert "  status        cancelled" in text
    assert "  Django status FAILED (TaskCancelled)" in text
    assert "path=tests.testapp.tasks.add" in text
    doc = json.loads(run("--id", result.id, "--json"))
    assert doc["task"]["id"] == int(result.id.rpartition(":")[2]) and doc["result_status"] == "FAILED"
    assert doc["result_id"] == result.id


def test_by_alias_and_primary_key_and_by_key_the_same_task() -> None:
    task = Task.objects.ensure("by-key-too", queue="default")
    alias = settings.DATABASE
    by_id = json.loads(run("--id", f"{alias}:{task.pk}", "--json"))
    by_key = json.loads(run("by-key-too", "--json"))
    assert by_id["task"] == by_key["task"] and by_id["result_status"] is None  # not a Django task
    if not several():
        assert json.loads(run("--id", str(task.pk), "--json"))["task"] == by_key["task"]
    assert json.loads(run("--id", str(task.pk), "--database", alias, "--json"))["task"] == by_key["task"]


def test_bad_and_unknown_ids_are_named() -> None:
    error = fails("--id", "nope")
    assert error.returncode == 2 and "'nope' is not a task id" in str(error)
    error = fails("--id", "elsewhere:3")
    assert error.returncode == 2 and "'elsewhere:3' names no task database" in str(error)
    error = fails("--id", f"{settings.DATABASE}:424242")
    assert error.returncode == 1 and f"no task {settings.DATABASE}:424242" in str(error)
    error = fails("some-key", "--id", "3")
    assert error.returncode == 2 and "either a key or --id" in str(error)
