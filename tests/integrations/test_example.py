"""The runnable example: the demo command end to end, the job API and page, the fenced publish.

The demo runs as the real command (``python -m example_project``) with short settings: on
SQLite against a fresh file (the path a fresh clone takes: migrate, WAL, no server), on
PostgreSQL against the suite's test database. Its summary is checked, and the database is
then checked again independently of the demo's own report.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from django_taskclaim.exceptions import StaleClaim
from django_taskclaim.models import Attempt, OutboxMessage, Task
from tests.conftest import ROOT, expire, require_module, requirement_missing

SHORT = ["--jobs", "6", "--agents", "3", "--work-seconds", "0.4", "--steps", "4", "--lease", "1"]


def demo_env(tmp_path: Path) -> dict[str, str]:
    """Environment for the demo: its own settings, the test database, artifacts in ``tmp_path``."""
    import os

    env = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")
    }
    env.update(PYTHONPATH=str(ROOT), TASKCLAIM_NO_VENV="1", EXAMPLE_VAR_DIR=str(tmp_path / "var"))
    sd = connection.settings_dict
    if connection.vendor == "postgresql":
        user, password = quote(sd["USER"] or "", safe=""), quote(sd["PASSWORD"] or "", safe="")
        env["DATABASE_URL"] = (
            f"postgresql://{user}:{password}@{sd['HOST'] or '127.0.0.1'}:{sd['PORT'] or 5432}"
            f"/{quote(str(sd['NAME']), safe='')}"
        )
    else:
        env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    return env


@pytest.fixture
def demo_database() -> None:
    """The demo runs on PostgreSQL's test database, elsewhere on a SQLite file of its own: on a
    MariaDB run that would be the SQLite run's demo again (example_project reads postgresql://
    and sqlite:// URLs only), so it is skipped there."""
    if connection.vendor == "mysql":
        pytest.skip("the example project runs on SQLite or PostgreSQL; the SQLite run covers this demo")


def run_demo(tmp_path: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "example_project", *args],
        cwd=ROOT,
        env=demo_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def query(tmp_path: Path, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """Run ``sql`` on the database the demo used (the test DB, or its own SQLite file)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall())
    db = sqlite3.connect(tmp_path / "demo.sqlite3")
    try:
        return db.execute(sql.replace("%s", "?"), params).fetchall()
    finally:
        db.close()


def check_demo(
    tmp_path: Path, proc: subprocess.CompletedProcess[str], chaos: tuple[str, ...], queued: bool = False
) -> None:
    """The demo's own verdict, then the database and the artifacts checked independently."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    # The demo runs on the test database on PostgreSQL, elsewhere on a SQLite file of its own
    # (example_project reads postgresql:// and sqlite:// DATABASE_URLs only).
    assert summary["database"] == ("postgresql" if connection.vendor == "postgresql" else "sqlite")
    assert summary["jobs"] == 6
    assert summary["artifacts_published"] == summary["jobs"]
    assert summary["lost"] == [] and summary["took_effect_twice"] == [] and summary["ok"]
    assert summary["errors"] == []
    assert summary["takeovers"] > 0
    assert summary["stale_writes_refused"] > 0  # the paused agent woke up and was fenced off
    if queued:  # no message queue: the workers claimed the jobs from the task table
        assert summary["deliveries"] == 0
    else:
        assert summary["duplicates_refused"] > 0
        assert summary["deliveries"] >= 2 * summary["jobs"]  # every job delivered more than once
    assert summary["executions_started"] > summary["jobs"]  # work restarted after the kill/pause
    for line in (*chaos, "TAKEOVER", "Summary"):
        assert line in proc.stdout

    run = summary["run"]
    rows = query(
        tmp_path,
        "SELECT status, result_ref, fencing_token, tenant, key FROM "
        "django_taskclaim_task WHERE key LIKE %s",
        [f"{run}:%"],
    )
    assert len(rows) == 6
    assert {r[0] for r in rows} == {"succeeded"}
    suites = query(
        tmp_path,
        "SELECT tenant, job_key, token, artifact FROM testgen_testsuite WHERE run = %s",
        [run],
    )
    assert len(suites) == 6  # one published suite per job: none twice, none lost
    assert {(r[3], r[4], r[2], r[1]) for r in rows} == {(s[0], s[1], s[2], s[3]) for s in suites}
    for _, ref, *_ in rows:
        body = (tmp_path / "var" / "artifacts" / ref).read_text()
        assert body.count("\ndef test_") == 4
    # Each model call is a durable step: stored once per job (4 calls), and never called again once
    # stored (its records, one file a call, by the calling claim's token; a call made again before its
    # store committed, by an agent killed or fenced off at that moment, is the documented window).
    steps = query(
        tmp_path,
        "SELECT t.tenant, t.key, s.name, s.token FROM django_taskclaim_step s "
        "JOIN django_taskclaim_task t ON t.id = s.task_id WHERE t.key LIKE %s",
        [f"{run}:%"],
    )
    assert sorted(name for _, _, name, _ in steps) == sorted([f"model-call-{n}" for n in range(1, 5)] * 6)
    from example_project.testgen.drafts import job_ref

    stored_by = {(job_ref(tenant, key), name.removeprefix("model-call-")): token for tenant, key, name, token in steps}
    made: dict[tuple[str, str], list[int]] = {}
    for record in (tmp_path / "var" / "artifacts" / "model-calls" / run).iterdir():
        ref, number, token, *_ = record.name.split(".")
        made.setdefault((ref, number), []).append(int(token[1:]))
    assert made.keys() == stored_by.keys()
    for call, tokens in made.items():
        assert [t for t in tokens if t >= stored_by[call]] == [stored_by[call]], (call, tokens)
    assert summary["model_calls_repeated"] == 0 and summary["model_calls"] == sum(map(len, made.values()))
    tenants = {r[3] for r in rows}
    assert tenants == {"acme", "globex"}  # the same keys in two tenants are two jobs

    # The second service: each suite went out through the outbox (recorded with its completion,
    # sent by the demo's relays) and arrived in the registry's own database exactly once.
    assert summary["messages_delivered"] == 6 and summary["messages_failed"] == 0
    assert summary["messages_pending"] == 0
    assert summary["registry_artifacts"] == 6
    assert summary["registry_lost"] == [] and summary["registry_twice"] == []
    db = sqlite3.connect(tmp_path / "var" / "registry.sqlite3")
    try:
        published = db.execute(
            "SELECT tenant, job_key, token, artifact FROM registry_publishedartifact WHERE run = ?",
            [run],
        ).fetchall()
    finally:
        db.close()
    assert sorted(published) == sorted((s[0], s[1], s[2], s[3]) for s in suites)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("demo_database")
def test_demo_every_job_takes_effect_once_despite_duplicates_pause_and_kill(tmp_path: Path) -> None:
    proc = run_demo(tmp_path, *SHORT, "--quiet", "--json")
    check_demo(tmp_path, proc, ("SIGSTOP", "SIGCONT", "SIGKILL", "FENCED"))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("demo_database")
def test_demo_with_django_tasks_run_by_taskclaim_workers(tmp_path: Path) -> None:
    proc = run_demo(tmp_path, *SHORT, "--worker", "--quiet", "--json")
    check_demo(tmp_path, proc, ("SIGSTOP", "SIGCONT", "SIGKILL", "FENCED"), queued=True)
    assert "Django's Tasks framework" in proc.stdout
    assert "[task " not in proc.stdout and "drained" not in proc.stdout  # --quiet: the chaos and the summary
    run = json.loads(proc.stdout.strip().splitlines()[-1])["run"]
    # Every job is one Django task (the double click enqueued nothing more), on the testgen queue.
    rows = query(tmp_path, "SELECT queue, task_path FROM django_taskclaim_task WHERE key LIKE %s", [f"{run}:%"])
    assert rows == [("testgen", "example_project.testgen.jobs_tasks.generate_suite")] * 6


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("demo_database")
def test_demo_through_real_celery_workers_and_redis(tmp_path: Path) -> None:
    require_module("django_taskclaim.celery", "the Celery bridge (pip install 'django-taskclaim[celery]')")
    from devtools.servers import RedisServer

    if shutil.which("redis-server") is None:
        requirement_missing("redis-server")
    with RedisServer() as redis:
        proc = run_demo(tmp_path, *SHORT, "--celery", "--redis-url", redis.url, "--quiet", "--json")
    check_demo(tmp_path, proc, ("SIGSTOP", "SIGCONT", "SIGKILL"))


def test_demo_help_and_bad_options_answer_without_django(tmp_path: Path) -> None:
    ok = run_demo(tmp_path, "--help", timeout=30)
    assert ok.returncode == 0 and "--work-seconds" in ok.stdout and "--celery" in ok.stdout
    bad = run_demo(tmp_path, "--agents", "1", timeout=30)
    assert bad.returncode == 2 and "at least 2" in bad.stderr
    bad = run_demo(tmp_path, "--lease", "-3", timeout=30)
    assert bad.returncode == 2 and "--lease" in bad.stderr
    bad = run_demo(tmp_path, "--celery", timeout=30)
    assert bad.returncode == 2 and "Redis URL" in bad.stderr
    bad = run_demo(tmp_path, "--worker", "--celery", "--redis-url", "redis://127.0.0.1:1/0", timeout=30)
    assert bad.returncode == 2 and "choose one" in bad.stderr


def test_demo_path_never_imports_celery(tmp_path: Path) -> None:
    code = (
        "import os, sys, django\n"
        "os.environ['DJANGO_SETTINGS_MODULE'] = 'example_project.settings'\n"
        "django.setup()\n"
        "import example_project.simulator.main, example_project.simulator.worker\n"
        "import example_project.simulator.work_agent, example_project.testgen.jobs_tasks\n"
        "import example_project.testgen.agent, example_project.testgen.views, example_project.urls\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'kombu'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=demo_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def test_example_project_checks_and_migrations_are_clean(tmp_path: Path) -> None:
    env = demo_env(tmp_path)
    registry = ["--settings", "example_project.registry_settings"]  # the second service
    for args in (
        ["check"],
        ["makemigrations", "--check", "--dry-run", "testgen"],
        ["check", *registry],
        ["makemigrations", "--check", "--dry-run", "registry", *registry],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "example_project.manage", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


# -- the job API and page, through the test client ------------------------------------------
@pytest.fixture
def example_app(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The example's app and URLs on top of the suite's settings, with its table while needed."""
    with override_settings(
        INSTALLED_APPS=[*settings.INSTALLED_APPS, "example_project.testgen"],
        ROOT_URLCONF="example_project.urls",
        ARTIFACT_DIR=tmp_path / "artifacts",
        TESTGEN_DISPATCH="demo",
        TESTGEN_WORK_SECONDS=0.01,
        TESTGEN_STEPS=2,
        TESTGEN_REGISTRY_URL="http://127.0.0.1:8001",
    ):
        from example_project.testgen.models import TestSuite

        # The demo test may have migrated the example app into this database already.
        create = TestSuite._meta.db_table not in connection.introspection.table_names()
        if create:
            with connection.schema_editor() as editor:
                editor.create_model(TestSuite)
        TestSuite.objects.all().delete()
        try:
            yield TestSuite
        finally:
            if create:
                with connection.schema_editor() as editor:
                    editor.delete_model(TestSuite)
            else:
                TestSuite.objects.all().delete()


BODY = {
    "tenant": "acme",
    "run": "run-42",
    "service": "payments",
    "endpoint": "POST /payments",
    "version": "v3",
}
KEY = "run-42:payments:POST /payments:test-generation@v3"


def post(client: Any, body: Any) -> Any:
    return client.post("/api/jobs", data=json.dumps(body), content_type="application/json")


@pytest.mark.django_db(transaction=True)
def test_post_requests_a_job_once_and_refuses_other_input_for_the_same_job(
    client, example_app
) -> None:  # type: ignore[no-untyped-def]
    first = post(client, BODY)
    assert first.status_code == 201, first.content
    assert first.json() == {"key": KEY, "tenant": "acme", "status": "pending", "created": True}
    again = post(client, BODY)  # a double click, a retried request
    assert again.status_code == 200 and again.json()["created"] is False
    other_tenant = post(client, {**BODY, "tenant": "globex"})
    assert other_tenant.status_code == 201 and other_tenant.json()["key"] == KEY
    assert Task.objects.filter(key=KEY).count() == 2
    task = Task.objects.get(tenant="acme", key=KEY)
    assert task.payload == {
        "service": "payments",
        "endpoint": "POST /payments",
        "spec_version": "v3",
        "framework": "pytest",
    }
    conflict = post(client, {**BODY, "framework": "unittest"})
    assert conflict.status_code == 409 and "different payload" in conflict.json()["error"]
    next_version = post(client, {**BODY, "version": "v4"})  # new input, new identity
    assert next_version.status_code == 201 and next_version.json()["key"].endswith("@v4")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({k: v for k, v in BODY.items() if k != "endpoint"}, "missing field(s): endpoint"),
        ({**BODY, "priority": "high"}, "unknown field(s): priority"),
        ({**BODY, "run": 42}, "must be non-empty strings: run"),
        ({**BODY, "endpoint": "POST /pay\x00ments"}, "non-printable"),
        (["not", "an", "object"], "JSON object"),
    ],
)
@pytest.mark.django_db(transaction=True)
def test_post_rejects_bad_input_with_a_clear_message(client, example_app, body, message) -> None:  # type: ignore[no-untyped-def]
    response = post(client, body)
    assert response.status_code == 400
    assert message in response.json()["error"]
    assert not Task.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_post_rejects_a_body_that_is_not_json(client, example_app) -> None:  # type: ignore[no-untyped-def]
    response = client.post("/api/jobs", data=b"{oops", content_type="application/json")
    assert response.status_code == 400 and "error" in response.json()
    assert client.put("/api/jobs").status_code == 405


@pytest.mark.django_db(transaction=True)
def test_state_endpoint_and_page_show_jobs_as_agents_work(client, example_app, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from example_project.testgen.agent import publish
    from example_project.testgen.drafts import write_draft
    from example_project.testgen.jobs import JobSpec

    post(client, BODY)
    post(client, {**BODY, "service": "users", "endpoint": "GET /users", "run": "run-43"})
    outcome = Task.objects.claim(KEY, "acme", owner="agent-1", lease=30)
    assert outcome.claimed and outcome.claim is not None
    duplicate = Task.objects.claim(KEY, "acme", owner="agent-2", lease=30)  # a redelivery
    assert not duplicate.claimed
    jobs = {j["key"]: j for j in client.get("/api/jobs").json()["jobs"]}
    assert jobs[KEY]["status"] == "running" and jobs[KEY]["owner"] == "agent-1"
    assert jobs[KEY]["duplicates_refused"] == 1 and jobs[KEY]["claims"] == 1

    spec = JobSpec("acme", "run-42", "payments", "POST /payments", "v3")
    rel, tests = write_draft(outcome.claim, spec, "agent-1")
    publish(outcome.claim, spec, "agent-1", rel, tests)
    only_run = client.get("/api/jobs", {"run": "run-42"}).json()["jobs"]
    assert [j["key"] for j in only_run] == [KEY]
    assert only_run[0]["status"] == "succeeded" and only_run[0]["artifact"] == rel
    assert only_run[0]["result"] == {"tests": 2, "agent": "agent-1", "token": 1}

    page = client.get("/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "run-42:payments:POST /payments:test-generation@v3" in html
    assert "1 succeeded" in html and "1 pending" in html and rel in html


@pytest.mark.django_db(transaction=True)
def test_publish_of_a_fenced_off_agent_writes_nothing(example_app, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from example_project.testgen.agent import publish
    from example_project.testgen.drafts import write_draft
    from example_project.testgen.jobs import JobSpec

    TestSuite = example_app
    spec = JobSpec("acme", "run-42", "payments", "POST /payments", "v3")
    slow = Task.objects.claim(spec.task_key, owner="paused-agent", lease=30).claim
    assert slow is not None
    rel_slow, tests = write_draft(slow, spec, "paused-agent")
    expire(slow)  # it was paused past its lease...
    fast = Task.objects.claim(spec.task_key, owner="agent-2", lease=30).claim  # ...and taken over
    assert fast is not None and fast.token == slow.token + 1
    rel_fast, _ = write_draft(fast, spec, "agent-2")
    assert rel_fast != rel_slow  # drafts are named by token: attempts never share a file
    publish(fast, spec, "agent-2", rel_fast, tests)
    with pytest.raises(StaleClaim):
        publish(slow, spec, "paused-agent", rel_slow, tests)
    assert list(TestSuite.objects.values_list("agent", "token")) == [("agent-2", 2)]
    task = Task.objects.get(key=spec.task_key.key)
    assert task.status == "succeeded" and task.result_ref == rel_fast
    assert Attempt.objects.get(task=task, token=1).stale_writes == 1
    # Its message to the registry went with it: only the owner's, recorded with the completion.
    message = OutboxMessage.objects.get()
    assert (message.url, message.token, message.effect) == ("http://127.0.0.1:8001/artifacts/", 2, "publish")
    assert message.body == {"tenant": "acme", "job_key": spec.task_key.key, "run": "run-42",
                            "token": 2, "artifact": rel_fast, "tests": tests}
    assert message.idempotency_key == fast.idempotency_key("publish")


def test_the_registry_takes_a_repeated_message_once_and_refuses_an_older_token(tmp_path: Path) -> None:
    """The second service as a relay meets it: a message delivered again (a relay killed before
    it recorded the answer) is answered from the stored response; an older owner is refused."""
    code = (
        "import json, os, django\n"
        "os.environ['DJANGO_SETTINGS_MODULE'] = 'example_project.registry_settings'\n"
        "django.setup()\n"
        "from django.core.management import call_command\n"
        "from django.test import Client\n"
        "from example_project.registry.models import PublishedArtifact\n"
        "os.makedirs(os.environ['EXAMPLE_VAR_DIR'], exist_ok=True)\n"
        "call_command('migrate', verbosity=0)\n"
        "body = {'tenant': 'acme', 'job_key': 'k', 'run': 'run-1', 'token': 2, 'artifact': 'a.py', 'tests': 3}\n"
        "from django.conf import settings\n"
        "from django_taskclaim.idempotency import signature\n"
        "secret = settings.TASKCLAIM_SIGNING_KEY.encode()\n"
        "def send(token, key='tc1-x', data=body, signed=True):\n"
        "    headers = {'Idempotency-Key': key, 'Taskclaim-Fencing-Key': 'tc1-f',\n"
        "               'Taskclaim-Fencing-Token': str(token)}\n"
        "    if signed:\n"
        "        headers['Taskclaim-Signature'] = signature(secret, 'tc1-f', str(token), key)\n"
        "    r = Client().post('/artifacts/', json.dumps(data), content_type='application/json', headers=headers)\n"
        "    return r.status_code, r.get('Idempotent-Replayed', '')\n"
        "print(json.dumps([send(2), send(2), send(1, 'tc1-y'), send(3, 'tc1-z', {**body, 'tests': 'x'}),\n"
        "                  Client().post('/artifacts/', '{}', content_type='application/json').status_code,\n"
        "                  send(9, 'tc1-u', signed=False), PublishedArtifact.objects.count()]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=demo_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    first, again, older, bad, unfenced, unsigned, rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first == [201, ""] and again == [201, "true"]  # delivered twice, stored once
    assert older[0] == 409 and bad[0] == 400 and unfenced == 400
    assert unsigned[0] == 401  # the two services share TASKCLAIM_SIGNING_KEY: an unsigned call is forged
    assert rows == 1


# -- --worker mode: the job API enqueues Django tasks, taskclaim_worker runs them -------------
@pytest.fixture
def tasks_mode(example_app):  # type: ignore[no-untyped-def]
    """The job API as ``--worker`` runs it: Django tasks on the example's ``TASKS``."""
    example_tasks = {"default": {"BACKEND": "django_taskclaim.tasks.ClaimBackend", "QUEUES": ["testgen"]}}
    with override_settings(TESTGEN_DISPATCH="tasks", TASKS=example_tasks):
        yield example_app


@pytest.mark.django_db(transaction=True)
def test_the_job_api_enqueues_one_keyed_django_task_per_job_and_a_worker_publishes_it(
    client, tasks_mode
) -> None:  # type: ignore[no-untyped-def]
    from django_taskclaim.tasks.compat import TaskResultStatus
    from django_taskclaim.tasks.runner import TaskRunner
    from django_taskclaim.worker import work
    from example_project.testgen.jobs_tasks import generate_suite

    first = post(client, BODY)
    assert first.status_code == 201, first.content
    assert first.json() == {"key": KEY, "tenant": "acme", "status": "pending", "created": True}
    assert post(client, BODY).json()["created"] is False  # a double click: the same task
    conflict = post(client, {**BODY, "framework": "unittest"})  # the same job, other input
    assert conflict.status_code == 409 and "different payload" in conflict.json()["error"]
    row = Task.objects.get()
    assert (row.tenant, row.key, row.queue) == ("acme", KEY, "testgen")
    assert row.task_path == "example_project.testgen.jobs_tasks.generate_suite"

    stats = work(TaskRunner("default"), owner="agent-1", queue="testgen", until_drained=True, poll=0.02)
    assert (stats.succeeded, stats.failed) == (1, 0)
    result = generate_suite.get_result(str(row.pk))
    assert result.status == TaskResultStatus.SUCCESSFUL and result.worker_ids == ["agent-1"]
    assert result.return_value == {"tests": 2, "agent": "agent-1", "token": 1}  # what the fenced publish stored
    assert list(tasks_mode.objects.values_list("job_key", "agent", "token")) == [(KEY, "agent-1", 1)]
    done = post(client, BODY)
    assert done.status_code == 200 and done.json()["status"] == "succeeded"  # never enqueued again


@pytest.mark.django_db(transaction=True)
def test_a_job_enqueued_in_a_rolled_back_request_is_gone_and_a_failed_job_runs_again(
    client, tasks_mode
) -> None:  # type: ignore[no-untyped-def]
    from django.db import transaction

    from example_project.testgen.jobs import JobSpec
    from example_project.testgen.views import request_job

    spec = JobSpec("acme", "run-42", "payments", "POST /payments", "v3")
    with pytest.raises(RuntimeError), transaction.atomic():
        request_job(spec)
        raise RuntimeError("the request failed after the job was enqueued")
    assert not Task.objects.exists()  # the task row rolled back with the request

    task, created = request_job(spec)
    assert created
    [claim] = Task.objects.claim_next(owner="agent-1", queue="testgen", path="*")
    claim.fail("the model was unavailable")  # no retry: FAILED
    again = post(client, BODY)  # after_failure=RUN_AGAIN: requested again, it runs again
    assert again.status_code == 200
    assert again.json() == {"key": KEY, "tenant": "acme", "status": "pending", "created": False}
    assert Task.objects.get().pk == task.pk


@pytest.mark.django_db(transaction=True)
def test_of_two_requests_racing_for_a_new_job_one_is_told_it_created_it(tasks_mode) -> None:  # type: ignore[no-untyped-def]
    """The first request's row is not committed yet when the second's insert arrives: the second
    waits for it and is told 200, not a second 201 (a look for the row beforehand sees nothing)."""
    import threading

    from django.db import connections, transaction

    from devtools.polling import wait_until
    from example_project.testgen.jobs import JobSpec
    from example_project.testgen.views import request_job

    if connection.vendor != "postgresql":
        pytest.skip("the second insert is seen waiting on PostgreSQL; SQLite serialises the two requests")
    spec = JobSpec("acme", "run-42", "payments", "POST /payments", "v3")
    inserted, commit = threading.Event(), threading.Event()
    told: dict[str, bool] = {}

    def request(name: str, hold: bool) -> None:
        try:
            with transaction.atomic():  # ATOMIC_REQUESTS: the response is decided inside the request
                told[name] = request_job(spec)[1]
                if hold:
                    inserted.set()
                    commit.wait(30)
        finally:
            connections.close_all()

    first = threading.Thread(target=request, args=("first", True))
    first.start()
    assert inserted.wait(30)
    second = threading.Thread(target=request, args=("second", False))
    second.start()
    with connection.cursor() as cursor:  # the second request's insert waits on the first's row
        def waiting() -> bool:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND wait_event_type = %s", ["Lock"])
            return cursor.fetchone()[0] > 0
        wait_until(waiting, timeout=30, what="the second request to wait for the first's row")
    commit.set()
    first.join(30)
    second.join(30)
    assert told == {"first": True, "second": False}
    assert Task.objects.count() == 1


def test_database_url_parsing() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from example_project.dburl import parse_database_url, redact

    default = Path("/tmp/x.sqlite3")
    assert parse_database_url("", default)["NAME"] == str(default)
    pg = parse_database_url("postgres://app:p%40ss@db.example:6543/jobs?sslmode=require", default)
    assert pg == {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "jobs",
        "USER": "app",
        "PASSWORD": "p@ss",
        "HOST": "db.example",
        "PORT": "6543",
        "OPTIONS": {"sslmode": "require"},
    }
    assert parse_database_url("sqlite:////abs/demo.db", default)["NAME"] == "/abs/demo.db"
    assert parse_database_url("sqlite:///rel/demo.db", default)["NAME"] == "rel/demo.db"
    with pytest.raises(ImproperlyConfigured, match="'mysql' is not supported"):
        parse_database_url("mysql://u@h/db", default)
    with pytest.raises(ImproperlyConfigured, match="names no database"):
        parse_database_url("postgresql://u:secret@h:5432/", default)
    with pytest.raises(ImproperlyConfigured, match="needs a file path"):
        parse_database_url("sqlite:///", default)
    assert "secret" not in redact("postgresql://u:secret@h/db")
