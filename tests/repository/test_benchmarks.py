"""The benchmark command in smoke size, and the prepared statements it led to (PostgreSQL only).

No timed assertion here: the smoke run proves the benchmark still works end to end (it
produces its table, and no system executed a job twice), not how fast anything is.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from django_taskclaim.models import Task

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    os.environ.get("TASKCLAIM_TEST_DB", "sqlite") != "postgresql",
    reason="benchmarks and prepared statements need PostgreSQL",
)


def prepared_statements() -> list[str]:
    """The names of this session's prepared statements that touch the task tables."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE statement LIKE %s", ["%django_taskclaim_%"])
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.django_db
def test_claim_and_complete_run_as_prepared_statements() -> None:
    # Fresh keys send the same statements from the second claim on (which claim statement a
    # session sends follows its last committed claim: prepared.claim_hint).
    Task.objects.claim("warm", owner="w").claim.complete()  # type: ignore[union-attr]
    Task.objects.claim("prepared", owner="w").claim.complete()  # type: ignore[union-attr]
    after_first = set(prepared_statements())
    assert len(after_first) >= 2  # the fused claim and the fused completion
    Task.objects.claim("prepared-2", owner="w").claim.complete()  # type: ignore[union-attr]
    assert set(prepared_statements()) == after_first  # prepared once per connection


@pytest.mark.django_db
def test_prepared_statements_can_be_turned_off(settings) -> None:
    # A session with nothing prepared, whatever tests ran on it before (psycopg, which still
    # believes the statements exist, finds out at the next prepared one and prepares again).
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    settings.TASKCLAIM_AUDIT = False  # statements of their own
    settings.TASKCLAIM_PREPARED_STATEMENTS = False
    before = set(prepared_statements())
    Task.objects.claim("plain", owner="w").claim.complete()  # type: ignore[union-attr]
    assert set(prepared_statements()) == before
    settings.TASKCLAIM_PREPARED_STATEMENTS = True
    Task.objects.claim("prepared", owner="w").claim.complete()  # type: ignore[union-attr]
    assert len(set(prepared_statements()) - before) == 2


@pytest.mark.django_db(transaction=True)
def test_statements_are_prepared_again_after_deallocate() -> None:
    Task.objects.claim("zero", owner="w")  # the next claims send the insert alone (prepared.claim_hint)
    Task.objects.claim("first", owner="w").claim.complete()  # type: ignore[union-attr]
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # what a pooler's DISCARD ALL does to the session
    outcome = Task.objects.claim("second", owner="w")
    assert outcome.claimed
    outcome.claim.complete()  # type: ignore[union-attr]
    assert Task.objects.get(key="second").status == Task.Status.SUCCEEDED
    assert len(prepared_statements()) == 2  # prepared again


@pytest.mark.slow
@pytest.mark.django_db
def test_benchmark_smoke_run(tmp_path: Path) -> None:
    """``python -m benchmarks --smoke`` on the test server: a table, and zero duplicates."""
    settings_dict = connection.settings_dict
    url = (f"postgresql://{settings_dict['USER']}@{settings_dict['HOST']}:{settings_dict['PORT']}"
           f"/{settings_dict['NAME']}")
    out, chart = tmp_path / "benchmarks.md", tmp_path / "benchmarks.png"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PGPASSWORD"] = str(settings_dict["PASSWORD"] or "")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--pg-url", url, "--smoke", "--db-name", f"taskclaim_bench_{os.getpid()}",
         "--out", str(out), "--chart", str(chart)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = out.read_text()
    assert "# Benchmarks (smoke size" in proc.stdout  # the table is printed too
    for heading in ("## By-key claim + complete", "## Queue drain", "## Claim latency by table size",
                    "## Contention", "## Attempt audit trail", "## Outbox", "## Durable steps", "## Targets"):
        assert heading in report, heading
    # A stored step: one statement, the first a claim asks for (it reads them all), then none.
    assert re.search(r"^\| statements per stored step .* \| 1 \| ≤ 1 \| yes \|$", report, re.M), report
    assert re.search(r"^\| statements of the other \d+ stored steps, in all \| 0 \| \|$", report, re.M), report
    # The outbox phase: both drains and the relays measured, no message sent twice.
    assert re.search(r"^\| [\d,]+ \| [\d,]+ \| [\d.]+ \| -?[\d.]+ \| [\d,]+ \| 0 \|$", report, re.M), report
    # Every measured cell holds a number: W = 1 and 2 for minimal, raw, app and app with audit
    # off, and the ratios.
    for w in (1, 2):
        row = rf"^\| {w} \| [\d,]+ \| [\d,]+ \| [\d,]+ \| [\d.]+–[\d.]+ \| [\d.]+ \| [\d,]+ \| [\d.]+–[\d.]+ \|$"
        assert re.search(row, report, re.M), report
    assert "app / minimal hand-written claim" in report
    duplicates = re.search(r"^\| duplicates \| (.+) \|$", report, re.M)
    assert duplicates is not None, report
    # django-taskclaim's one-task loop and batching worker, and the commit-limit loops of their
    # statements (no peers in smoke size).
    assert [cell.strip() for cell in duplicates.group(1).split("|")] == ["0", "0", "0", "0"], report
    for system in ("django-taskclaim worker (batch 16)", "commit limit (the same statements, psycopg)",
                   "commit limit, batch 16 (the same statements, psycopg)"):
        assert f"| {system} |" in report or f"| {system} " in report, system
    assert re.search(r"the worker, batch 16, as a fraction of the commit limit .* \| [\d.]+( \(max [\d.]+\))? \| "
                     r"report \|", report), report
    assert "| duplicate executions, every system and W | 0 | = 0 | yes |" in report
    assert "Exactly one winner per key" in report
    # claim_next timed on one queue at a time and on all eight at once, by-key claims beside them.
    for label in ("by-key claim p50", "claim_next, one queue at a time (8 queues in use) p50",
                  "claim_next over all 8 queues at once p50"):
        assert re.search(rf"^\| {re.escape(label)} at 10,000 finished rows / at 1,000 \| [\d.]+", report, re.M), label


@pytest.mark.slow
@pytest.mark.django_db
def test_benchmark_tasks_phase_smoke_run(tmp_path: Path) -> None:
    """``--smoke --phases tasks``: each system drains through its own worker command (the peers in
    virtualenvs of their own, made on first use: django-ox under Python 3.12), with zero
    duplicates, and enqueues in bulk its own way."""
    settings_dict = connection.settings_dict
    url = (f"postgresql://{settings_dict['USER']}@{settings_dict['HOST']}:{settings_dict['PORT']}"
           f"/{settings_dict['NAME']}")
    out = tmp_path / "benchmarks.md"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PGPASSWORD"] = str(settings_dict["PASSWORD"] or "")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--pg-url", url, "--smoke", "--phases", "tasks",
         "--db-name", f"taskclaim_bench_tasks_{os.getpid()}", "--out", str(out), "--chart", "-"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = out.read_text()
    assert "## Django Tasks API: drain of 100 no-op tasks at W = 2, bulk enqueue of 200" in report, report
    # Every configuration of each peer drained every task once: a rate, and 0 duplicates.
    peers = ["django-tasks-db (db_worker, one queue)", "django-tasks-db (db_worker, all queues)"] + [
        f"django-ox (ox_worker --concurrency {c})" for c in (1, 2, 4)]
    for label in peers:
        row = rf"^\| django-(tasks-db|ox) \| {re.escape(label)} \| [\d,]+ \| [\d,]+ \| 0 \|$"
        assert re.search(row, report, re.M), label
    for label in ("django-tasks-db (Task.enqueue)", "django-ox (Task.enqueue)", "django-ox (enqueue_many)"):
        assert re.search(rf"^\| django-(tasks-db|ox) \| {re.escape(label)} \| [\d.]+ \| [\d,]+ \| [\d.]+ \|$", report,
                         re.M), label
    assert re.search(r"^- django-ox: Python 3\.1[2-9]\.\d+, Django 6\.1\.\d+, django-ox ", report, re.M), report
    assert re.search(r"^- django-tasks-db: Python 3\.11\.\d+, Django 5\.2\.\d+, django-tasks 0\.12", report, re.M)
    assert "| duplicate executions, Django Tasks drain, every system | 0 | = 0 | yes |" in report
    # Ours: taskclaim_worker one task at a time and 16, Task.enqueue() and enqueue_many, every ratio taken.
    for label in ("django-taskclaim (taskclaim_worker --queue default)",
                  "django-taskclaim (taskclaim_worker --queue default --batch 16)"):
        row = rf"^\| django-taskclaim \| {re.escape(label)} \| [\d,]+ \| [\d,]+ \| 0 \|$"
        assert re.search(row, report, re.M), label
    for label in ("django-taskclaim (Task.enqueue)", "django-taskclaim (enqueue_many)"):
        assert re.search(rf"^\| django-taskclaim \| {re.escape(label)} \| [\d.]+ \| [\d,]+ \| [\d.]+ \|$", report,
                         re.M), label
    for peer in ("django-tasks-db", "django-ox"):
        assert re.search(rf"^\| Django Tasks API: drain at W=2, django-taskclaim \(ClaimBackend\) at its best vs "
                         rf"{peer} at its best \| [\d.]+", report, re.M), report
        assert re.search(rf"^\| Django Tasks API: bulk enqueue of 200 tasks in one transaction, django-taskclaim vs "
                         rf"{peer} at its best \| [\d.]+", report, re.M), report
