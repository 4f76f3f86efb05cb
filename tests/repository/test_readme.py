"""The README cannot rot: its quickstart runs, its sample output matches, its links resolve."""

from __future__ import annotations

import io
import json
import re
import shlex
import sys
import tomllib
import types
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from django_taskclaim.models import Attempt, Task
from tests.conftest import ROOT, expire
from tests.testapp.models import Effect

README = ROOT / "README.md"

# Written on other branches of the same release; remove a name once its file is merged.
DOCS_OF_OTHER_ISSUES: set[str] = set()  # docs written on other branches, exempt until merged


def section(title: str) -> str:
    text = README.read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def quickstart() -> str:
    blocks = python_blocks(section("Quickstart"))
    assert blocks, "the quickstart has no python block"
    return "\n".join(blocks)


class Suite:
    """Stand-in for the reader's model: each ``create`` writes a real row (a ``testapp.Effect``)."""

    class objects:  # noqa: N801 - mimics a model manager
        @staticmethod
        def create(key: str, body: str) -> Effect:
            return Effect.objects.create(task_key=key, token=0, worker=body[:255])


def run_snippet(generate_tests: Any) -> tuple[dict[str, Any], str]:
    namespace: dict[str, Any] = {"generate_tests": generate_tests, "Suite": Suite}
    out = io.StringIO()
    with redirect_stdout(out):
        exec(compile(quickstart(), str(README), "exec"), namespace)  # noqa: S102 - the README's own code
    return namespace, out.getvalue()


KEY = "run-42:payments:test-generation@v3"


@pytest.mark.django_db(transaction=True)
def test_quickstart_runs_the_work_once_for_two_deliveries() -> None:
    calls: list[str] = []

    def generate_tests(key: str) -> str:
        calls.append(key)
        return f"def test_{len(calls)}(): ..."

    first, out = run_snippet(generate_tests)  # the first delivery does the work
    assert first["key"].key == KEY and first["key"].tenant == "acme"
    assert out == ""
    second, out = run_snippet(generate_tests)  # a redelivery reads the outcome instead
    assert not second["outcome"].claimed
    assert out.strip() == f"succeeded suites/{KEY}"
    assert calls == [KEY]
    assert list(Effect.objects.values_list("task_key", flat=True)) == [KEY]
    task = Task.objects.get(tenant="acme", key=KEY)
    assert task.status == "succeeded" and task.result_ref == f"suites/{KEY}"
    assert Attempt.objects.filter(task=task, outcome="duplicate").count() == 1


@pytest.mark.django_db(transaction=True)
def test_quickstart_drops_the_work_of_a_worker_that_was_taken_over() -> None:
    def slow_generate_tests(key: str) -> str:
        # While this worker "thinks", its lease runs out and another worker takes the task over.
        task = Task.objects.get(tenant="acme", key=key)
        expire(task)
        assert Task.objects.claim(key, "acme", owner="newer-worker", lease=30).claimed
        return "def test_stale(): ..."

    namespace, out = run_snippet(slow_generate_tests)
    assert namespace["outcome"].claimed and out == ""
    assert not Effect.objects.exists()  # the fenced write was refused and rolled back
    task = Task.objects.get(tenant="acme", key=KEY)
    assert task.status == "running" and task.owner == "newer-worker" and task.fencing_token == 2
    assert Attempt.objects.get(task=task, token=1).stale_writes == 1


def test_quickstart_is_short() -> None:
    code_lines = [line for line in quickstart().splitlines() if line.strip()]
    assert len(code_lines) <= 22, len(code_lines)


def test_readme_keeps_the_two_commands_and_stays_short() -> None:
    text = README.read_text()
    commands = section("Try it: two commands on a fresh clone")
    assert "python3 -m example_project " in commands and "python3 -m tests " in commands
    assert len(text.splitlines()) <= 215  # 170 before the Django Tasks quickstart (issue 40)


# ---- The quickstart with Django Tasks: settings, @task with @keyed, the worker, the admin ----------
TASKS_QUICKSTART = "Quickstart with Django Tasks"


class Receipt:
    """Stand-in for the reader's model: each ``create`` writes a real row (a ``testapp.Effect``)."""

    class objects:  # noqa: N801 - mimics a model manager
        @staticmethod
        def create(order_id: int) -> Effect:
            return Effect.objects.create(task_key=f"receipt-{order_id}", token=0, worker="readme")


def test_django_tasks_quickstart_names_extras_that_exist_and_the_backend() -> None:
    text = section(TASKS_QUICKSTART)
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = {extra for group in re.findall(r"`(?:django-taskclaim)?\[([a-z,]+)\]`", text) for extra in group.split(",")}
    assert {"postgresql", "mysql", "tasks"} <= named and named <= extras, named - extras
    settings_block, _ = python_blocks(text)
    namespace: dict[str, Any] = {}
    exec(compile(settings_block, str(README), "exec"), namespace)  # noqa: S102 - the README's own code
    from django.conf import settings
    from django.utils.module_loading import import_string

    from django_taskclaim.tasks import ClaimBackend

    backend = namespace["TASKS"]["default"]["BACKEND"]
    assert import_string(backend) is ClaimBackend and settings.TASKS["default"]["BACKEND"] == backend


@pytest.mark.django_db(transaction=True)
def test_django_tasks_quickstart_enqueues_once_runs_under_the_worker_and_shows_in_the_admin() -> None:
    from django.core.management import call_command
    from django.urls import resolve

    from django_taskclaim.tasks.compat import TaskResultStatus

    text = section(TASKS_QUICKSTART)
    _, code = python_blocks(text)
    # The reader's tasks.py, a module of its own: the worker imports the task by its path.
    module = types.ModuleType("readme_django_tasks")
    module.Receipt = Receipt  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        exec(compile(code, str(README), "exec"), module.__dict__)  # noqa: S102 - the README's own code
        first = module.send_receipt.enqueue(7)  # type: ignore[attr-defined]  # a third request
        assert Task.objects.count() == 1
        worker = re.search(r"^python manage\.py (taskclaim_worker\b[^#\n]*)", text, re.M)
        assert worker, "the section runs no taskclaim_worker"
        out = io.StringIO()
        call_command(*shlex.split(worker.group(1)), "--until-drained", "--json", stdout=out)
        assert json.loads(out.getvalue().strip().splitlines()[-1])["succeeded"] == 1
        result = module.send_receipt.get_result(first.id)  # type: ignore[attr-defined]
    finally:
        del sys.modules[module.__name__]
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "sent"
    assert list(Effect.objects.values_list("task_key", flat=True)) == ["receipt-7"]  # once
    task = Task.objects.get()
    assert task.tenant == "acme" and task.status == "succeeded"
    admin = re.search(r"`(/admin/[^`]+)`", text)
    assert admin and resolve(admin.group(1)).url_name == "django_taskclaim_task_changelist"


def test_readme_sample_summary_matches_what_the_demo_prints() -> None:
    from example_project.simulator.report import print_summary

    sample = re.search(r"```text\n(Summary\n.*?)```", README.read_text(), re.S)
    assert sample, "the README shows no sample summary"
    summary = {
        "database": "sqlite",
        "run": "run-1",
        "jobs": 12,
        "deliveries": 40,
        "redeliveries": 2,
        "busy_retries": 14,
        "executions_started": 14,
        "duplicates_refused": 26,
        "takeovers": 2,
        "stale_writes_refused": 1,
        "artifacts_published": 12,
        "drafts_discarded": 2,
        "model_calls": 48,
        "model_calls_repeated": 0,
        "model_calls_rerun": 0,
        "lost": [],
        "took_effect_twice": [],
        "messages_delivered": 12,
        "messages_failed": 0,
        "messages_pending": 0,
        "registry_artifacts": 12,
        "registry_lost": [],
        "registry_twice": [],
        "ok": True,
    }
    out = io.StringIO()
    print_summary(summary, out)
    assert out.getvalue().strip() == sample.group(1).strip()


def test_links_in_readme_and_docs_resolve() -> None:
    missing = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # an external address
            path = (page.parent / target).resolve()
            rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
            if not path.exists() and rel not in DOCS_OF_OTHER_ISSUES:
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, missing


def test_docs_index_links_every_page() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} | {
        Path(p).name for p in DOCS_OF_OTHER_ISSUES
    }
    unlinked = sorted(p for p in pages - {"index.md"} if f"({p})" not in index)
    assert not unlinked, unlinked
