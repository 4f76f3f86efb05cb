"""The operator commands: taskclaim_inspect, taskclaim_audit, taskclaim_purge (and taskclaim_reclaim)."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_taskclaim.exceptions import StaleClaim
from django_taskclaim.models import Attempt, Task
from tests.conftest import expire

pytestmark = pytest.mark.django_db


def run(*args: str, **options: object) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue()


def fails(*args: str, **options: object) -> tuple[CommandError, str]:
    out = io.StringIO()
    with pytest.raises(CommandError) as info:
        call_command(*args, stdout=out, stderr=io.StringIO(), **options)
    return info.value, out.getvalue()


def age(queryset, days: float) -> None:  # type: ignore[no-untyped-def]
    queryset.update(updated_at=timezone.now() - dt.timedelta(days=days))


# -- taskclaim_inspect -------------------------------------------------------------------------
def test_inspect_shows_task_and_timeline() -> None:
    first = Task.objects.claim("report-7", tenant="acme", owner="w1", lease=600,
                               payload={"n": 7}, delivery_id="msg-1").claim
    assert first
    expire(first)
    second = Task.objects.claim("report-7", tenant="acme", owner="w2", delivery_id="msg-2").claim
    assert second
    Task.objects.claim("report-7", tenant="acme", owner="w3", delivery_id="msg-3")  # duplicate
    second.complete({"rows": 3}, result_ref="s3://bucket/report-7")
    text = run("taskclaim_inspect", "report-7", "--tenant", "acme")
    assert "task 'report-7' tenant='acme'" in text
    assert "status        succeeded" in text
    assert "fencing token 2" in text
    assert 's3://bucket/report-7' in text and '{"rows": 3}' in text
    lines = text.split("attempts (3):")[1].strip().splitlines()
    assert len(lines) == 3
    assert "taken_over" in lines[0] and "owner='w1'" in lines[0] and "delivery=msg-1" in lines[0]
    assert "succeeded" in lines[1] and "owner='w2'" in lines[1] and "token    2" in lines[1]
    assert "duplicate" in lines[2] and "owner='w3'" in lines[2] and "token    -" in lines[2]


def test_inspect_json() -> None:
    claim = Task.objects.claim("j-1", owner="w1", lease=600).claim
    assert claim
    doc = json.loads(run("taskclaim_inspect", "j-1", "--json"))
    assert doc["task"]["status"] == "running" and doc["task"]["fencing_token"] == 1
    assert 590 < doc["task"]["lease_remaining"] <= 600  # by the database clock
    assert [a["outcome"] for a in doc["attempts"]] == ["running"]
    assert doc["attempts"][0]["token"] == 1 and doc["attempts"][0]["seconds"] is None


def test_inspect_not_found_and_bad_arguments() -> None:
    Task.objects.ensure("only-here", tenant="t1")
    error, _ = fails("taskclaim_inspect", "only-here")
    assert error.returncode == 1
    assert "no task 'only-here' for tenant ''" in str(error) and "'t1'" in str(error)
    error, _ = fails("taskclaim_inspect", "bad\x00key")
    assert "non-printable" in str(error)
    error, _ = fails("taskclaim_inspect", "x" * 300)
    assert "limit is 255" in str(error)


# -- taskclaim_audit ---------------------------------------------------------------------------
def plant_overlap(key: str, start: dt.datetime) -> Task:
    """Two claims of one task whose intervals overlap: what fencing must never let happen."""
    task = Task.objects.ensure(key)
    Attempt.objects.create(task=task, token=1, owner="ghost-a", started_at=start,
                           ended_at=start + dt.timedelta(seconds=10), outcome="succeeded")
    Attempt.objects.create(task=task, token=2, owner="ghost-b",
                           started_at=start + dt.timedelta(seconds=5),
                           ended_at=start + dt.timedelta(seconds=20), outcome="succeeded")
    return task


def test_audit_clean_history_exits_zero() -> None:
    c = Task.objects.claim("a-1", lease=600).claim
    assert c
    c.complete()
    text = run("taskclaim_audit")
    assert "overlapping executions: 0" in text and "result: ok" in text


def test_audit_finds_planted_overlap_and_exits_one() -> None:
    plant_overlap("twice", timezone.now() - dt.timedelta(minutes=5))
    error, text = fails("taskclaim_audit")
    assert error.returncode == 1
    assert "overlapping executions: 1" in text
    assert "'twice': token 1 (ghost-a" in text and "overlaps token 2 (ghost-b" in text
    assert "result: OVERLAP FOUND" in text
    error, text = fails("taskclaim_audit", "--json")
    assert error.returncode == 1
    doc = json.loads(text)
    assert doc["overlaps"]["count"] == 1
    assert doc["overlaps"]["items"][0]["first"]["owner"] == "ghost-a"
    assert doc["overlaps"]["items"][0]["second"]["owner"] == "ghost-b"


def test_audit_open_claim_overlaps_until_now() -> None:
    """An earlier claim still open (no ended_at) overlaps a later one: measured to the DB's now."""
    claim = Task.objects.claim("open", owner="a", lease=600).claim
    assert claim
    started = Attempt.objects.get(task_id=claim.task_id, token=1).started_at
    Attempt.objects.create(task_id=claim.task_id, token=2, owner="b",
                           started_at=started + dt.timedelta(milliseconds=1), outcome="running")
    error, _ = fails("taskclaim_audit")
    assert error.returncode == 1


def test_audit_back_to_back_claims_do_not_overlap() -> None:
    """A takeover closes the old attempt as the new one starts: touching, not overlapping."""
    old = Task.objects.claim("handover", owner="a", lease=600).claim
    assert old
    expire(old)
    new = Task.objects.claim("handover", owner="b").claim
    assert new
    with pytest.raises(StaleClaim):  # counted as a fenced-off write
        old.complete()
    Task.objects.claim("handover", owner="c", delivery_id="redelivered")  # duplicate
    new.complete()
    doc = json.loads(run("taskclaim_audit", "--json"))
    assert doc["overlaps"]["count"] == 0
    assert doc["takeovers"]["count"] == 1
    item = doc["takeovers"]["items"][0]
    got = (item["key"], item["token"], item["owner"], item["taken_by"])
    assert got == ("handover", 1, "a", "b")
    assert doc["stale_writes"]["count"] == 1 and doc["stale_writes"]["items"][0]["owner"] == "a"
    assert doc["duplicates"]["count"] == 1 and doc["duplicates"]["items"][0]["key"] == "handover"
    text = run("taskclaim_audit", "--verbosity", "2")
    assert "takeovers: 1" in text and "token 1 of a taken over by b" in text
    assert "fenced-off writes: 1 (in 1 attempt(s))" in text
    assert "duplicate deliveries: 1 (in 1 task(s))" in text


def test_audit_since() -> None:
    plant_overlap("long-ago", timezone.now() - dt.timedelta(days=3))
    assert "overlapping executions: 0" in run("taskclaim_audit", "--since", "1d")
    assert "overlapping executions: 0" in run("taskclaim_audit", "--since", "2d12h")
    since = (timezone.now() - dt.timedelta(days=2)).isoformat()
    assert "overlapping executions: 0" in run("taskclaim_audit", "--since", since)
    error, _ = fails("taskclaim_audit", "--since", "4d")
    assert error.returncode == 1
    error, _ = fails("taskclaim_audit", "--since", "2000-01-01")
    assert error.returncode == 1


@pytest.mark.parametrize("bad", ["yesterday", "10", "0d", "-5m", "3x"])
def test_audit_bad_since(bad: str) -> None:
    error, _ = fails("taskclaim_audit", "--since", bad)
    assert "--since" in str(error) or "duration" in str(error) or "zero" in str(error)


@pytest.mark.django_db(transaction=True)
def test_audit_finds_nothing_after_clean_multiprocess_drain(spawn) -> None:  # type: ignore[no-untyped-def]
    from tests.testapp.models import Effect

    for i in range(30):
        Task.objects.ensure(f"drain-{i}", queue="default")
    workers = [spawn("drain", "--tag", f"w{n}", "--lease", "30") for n in range(3)]
    for proc in workers:
        proc.finish(90)
    assert Task.objects.succeeded().count() == 30
    assert Effect.objects.count() == 30
    text = run("taskclaim_audit")
    assert "overlapping executions: 0" in text and "result: ok" in text
    assert Attempt.objects.filter(token__isnull=False).count() == 30


# -- taskclaim_purge ---------------------------------------------------------------------------
@pytest.fixture
def history() -> None:
    for i in range(5):
        c = Task.objects.claim(f"old-ok-{i}").claim
        assert c
        c.complete(i)
    f = Task.objects.claim("old-failed").claim
    assert f
    f.fail("x")
    Task.objects.ensure("old-cancelled")
    Task.objects.filter(key="old-cancelled").cancel()
    Task.objects.ensure("old-pending")
    Task.objects.claim("old-running", lease=600)
    age(Task.objects.filter(key__startswith="old-"), days=40)
    recent = Task.objects.claim("new-ok").claim
    assert recent
    recent.complete()


def keys() -> set[str]:
    return set(Task.objects.values_list("key", flat=True))


def test_purge_deletes_only_old_finished_tasks_in_batches(history) -> None:  # type: ignore[no-untyped-def]
    attempts_before = Attempt.objects.count()
    with CaptureQueriesContext(connection) as ctx:
        text = run("taskclaim_purge", "--older-than", "30d", "--batch-size", "3")
    assert keys() == {"old-pending", "old-running", "new-ok"}
    assert "deleted 7 task(s) and 6 attempt(s)" in text  # the cancelled one never ran
    assert Attempt.objects.count() == attempts_before - 6
    savepoints = [q for q in ctx.captured_queries if q["sql"].upper().startswith("SAVEPOINT")]
    assert len(savepoints) == 3  # batches of 3, 3, 1: one transaction each
    assert "\r" not in text  # no progress when stdout is not a terminal


def test_purge_by_status_and_age(history) -> None:  # type: ignore[no-untyped-def]
    text = run("taskclaim_purge", "--older-than", "30d", "--status", "failed", "cancelled")
    assert "deleted 2 task(s)" in text
    assert {"old-failed", "old-cancelled"}.isdisjoint(keys()) and "old-ok-0" in keys()
    assert "deleted 0 task(s)" in run("taskclaim_purge", "--older-than", "41d")
    run("taskclaim_purge", "--older-than", "1h", "--status", "succeeded")
    assert keys() == {"old-pending", "old-running", "new-ok"}


def test_purge_dry_run(history) -> None:  # type: ignore[no-untyped-def]
    before = keys()
    text = run("taskclaim_purge", "--older-than", "30d", "--dry-run")
    assert keys() == before
    assert "would delete 5 succeeded task(s)" in text and "would delete 1 failed task(s)" in text
    assert "7 task(s) and 6 attempt(s)" in text and "nothing changed" in text


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_purge_progress_on_a_terminal(history) -> None:  # type: ignore[no-untyped-def]
    out = Terminal()
    call_command("taskclaim_purge", "--older-than", "30d", "--batch-size", "2", stdout=out)
    text = out.getvalue()
    assert "\rpurged 2/7 task(s)" in text and "\rpurged 7/7 task(s)" in text


@pytest.mark.parametrize(("args", "message"), [
    ([], "--older-than"),
    (["--older-than", "soon"], "not a duration"),
    (["--older-than", "0s"], "longer than zero"),
    (["--older-than", "1d", "--status", "running"], "never purged"),
    (["--older-than", "1d", "--batch-size", "0"], "must be 1 or more"),
])
def test_purge_bad_arguments(history, args, message) -> None:  # type: ignore[no-untyped-def]
    before = keys()
    error, _ = fails("taskclaim_purge", *args)
    assert message in str(error)
    assert keys() == before


# -- reclaim (the core's command, documented in docs/operations.md) ----------------------------
def test_reclaim_command_dry_run_and_verbose() -> None:
    """Regression: ``reclaim`` read ``self.verbosity``, which BaseCommand never sets."""
    c = Task.objects.claim("rc-1", owner="w", lease=600).claim
    assert c
    expire(c)
    text = run("taskclaim_reclaim", "--dry-run")
    assert "would reclaim 'rc-1'" in text and "1 expired task(s) found, nothing changed" in text
    text = run("taskclaim_reclaim", "--verbosity", "2")
    assert "reclaimed 'rc-1'" in text and "1 expired task(s): 1 back to pending" in text
    assert Task.objects.get(key="rc-1").status == "pending"


# -- the database clock, not the process clock ---------------------------------------------------
@pytest.fixture
def clock_two_hours_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's clock runs 2 h ahead of the database's (a skewed host)."""
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + dt.timedelta(hours=2))


def test_purge_cuts_off_by_the_database_clock(clock_two_hours_ahead) -> None:  # type: ignore[no-untyped-def]
    """Regression: a process 2 h ahead purged a task that finished a moment earlier."""
    c = Task.objects.claim("just-done").claim
    assert c
    c.complete()
    text = run("taskclaim_purge", "--older-than", "1h")
    assert "deleted 0 task(s)" in text and keys() == {"just-done"}
    doc = json.loads(run("taskclaim_purge", "--older-than", "1h", "--dry-run", "--json"))
    assert doc["tasks"] == 0 and doc["dry_run"] is True
    cutoff = dt.datetime.fromisoformat(doc["cutoff"])
    assert abs((cutoff - (timezone.now() - dt.timedelta(hours=3))).total_seconds()) < 600


def test_audit_since_counts_back_from_the_database_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    plant_overlap("half-an-hour-ago", timezone.now() - dt.timedelta(minutes=30))
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + dt.timedelta(hours=2))
    error, _ = fails("taskclaim_audit", "--since", "1h")  # 30 min ago by the database's clock
    assert error.returncode == 1


# -- --json everywhere, failures included ---------------------------------------------------------
def test_purge_and_reclaim_json() -> None:
    c = Task.objects.claim("rj-1", owner="w", lease=600).claim
    assert c
    expire(c)
    done = Task.objects.claim("rj-2").claim
    assert done
    done.complete()
    age(Task.objects.filter(key="rj-2"), days=3)
    doc = json.loads(run("taskclaim_reclaim", "--dry-run", "--json"))
    assert doc["dry_run"] is True and doc["pending"] == 1 and doc["requeue"] is None
    assert [(r["key"], r["status"]) for r in doc["reclaimed"]] == [("rj-1", "pending")]
    assert Task.objects.get(key="rj-1").status == "running"  # a dry run
    doc = json.loads(run("taskclaim_reclaim", "--json"))
    assert doc["dry_run"] is False and [r["key"] for r in doc["reclaimed"]] == ["rj-1"]
    assert Task.objects.get(key="rj-1").status == "pending"
    doc = json.loads(run("taskclaim_purge", "--older-than", "1d", "--json"))
    assert (doc["tasks"], doc["attempts"], doc["dry_run"]) == (1, 1, False)


def test_reclaim_requeue_dry_run_lists_what_it_would_send() -> None:
    from tests.conftest import require_module

    require_module("celery", "celery (pip install 'django-taskclaim[celery]')")
    from django_taskclaim.claims import ensure

    dispatch = {"task": "tests.programs.celery_app.work", "task_id": "msg-lost", "args": ["a"], "kwargs": {}}
    ensure("rq-expired", dispatch=dispatch)
    c = Task.objects.claim("rq-expired", owner="w", lease=600).claim
    assert c
    expire(c)
    ensure("rq-stale", dispatch={**dispatch, "task_id": "msg-stale"})
    age(Task.objects.filter(key="rq-stale"), days=1)
    ensure("rq-fresh", dispatch={**dispatch, "task_id": "msg-fresh"})
    before = list(Task.objects.order_by("pk").values_list("key", "status", "updated_at", "dispatch"))
    text = run("taskclaim_reclaim", "--requeue", "--dry-run")
    assert "would re-send 'rq-expired' tenant='' (message msg-lost)" in text
    assert "would re-send 'rq-stale' tenant='' (message msg-stale)" in text
    assert "rq-fresh" not in text.split("reclaim (dry run)")[1]
    assert "requeue (dry run): 2 lost message(s) would be re-sent" in text
    doc = json.loads(run("taskclaim_reclaim", "--requeue", "--dry-run", "--json"))
    assert sorted(i["celery_task_id"] for i in doc["requeue"]) == ["msg-lost", "msg-stale"]
    assert list(Task.objects.order_by("pk").values_list("key", "status", "updated_at", "dispatch")) == before



@pytest.mark.parametrize(("args", "message"), [
    (["taskclaim_reclaim", "--every", "inf"], "too long"),
    (["taskclaim_reclaim", "--every", "nan"], "greater than zero"),
    (["taskclaim_reclaim", "--requeue-after", "1e300"], "too long"),
    (["taskclaim_reclaim", "--limit", "1e23"], "not a whole number"),
    (["taskclaim_reclaim", "--limit", "100000000000000000000000"], "too large"),
    (["taskclaim_audit", "--since", "99999999d"], "too long"),
    (["taskclaim_audit", "--since", "2026-02-30T00:00:00"], "not a valid date"),
    (["taskclaim_audit", "--limit", "99999999999999999999"], "too large"),
    (["taskclaim_purge", "--older-than", "99999999d"], "too long"),
    (["taskclaim_purge", "--older-than", "999999999999999999999w"], "too long"),
    (["taskclaim_purge", "--older-than", "1d", "--batch-size", "1e23"], "not a whole number"),
])
def test_out_of_range_arguments_are_usage_errors(command_line, args, message) -> None:  # type: ignore[no-untyped-def]
    done = command_line(*args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    with_json = command_line(*args, "--json")
    assert with_json.returncode == 2
    assert message in json.loads(with_json.stdout)["error"]
    error, _ = fails(*args)  # call_command: the same message, the same exit code
    assert error.returncode == 2 and message in str(error)


def test_failures_print_json_with_json(command_line) -> None:  # type: ignore[no-untyped-def]
    done = command_line("taskclaim_inspect", "unknown-key", "--json")
    assert done.returncode == 1
    doc = json.loads(done.stdout)
    assert doc == {"error": "no task 'unknown-key' for tenant ''", "returncode": 1}
    assert "no task 'unknown-key'" in done.stderr
    done = command_line("taskclaim_reclaim", "--requeue-after", "5", "--json")
    assert done.returncode == 2 and json.loads(done.stdout)["error"] == "--requeue-after needs --requeue"


def test_database_errors_are_raised_and_reported_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import OperationalError

    from django_taskclaim.management.commands import taskclaim_purge

    def broken(using: str | None = None) -> dt.datetime:
        raise OperationalError("the database went away")

    monkeypatch.setattr(taskclaim_purge, "database_now", broken)
    out = io.StringIO()
    with pytest.raises(OperationalError):  # never swallowed
        call_command("taskclaim_purge", "--older-than", "1d", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {"error": "OperationalError: the database went away", "returncode": 1}


@pytest.mark.django_db(transaction=True)
def test_inspect_without_a_key_shows_each_queues_depth_and_oldest_due_task() -> None:
    import datetime as dt
    import io
    import json

    from django.core.management import call_command
    from django.utils import timezone

    from django_taskclaim.models import Task

    for i in range(2):
        Task.objects.ensure(f"j{i}", queue="jobs")
    Task.objects.ensure("later", queue="jobs", run_after=timezone.now() + dt.timedelta(hours=1))
    Task.objects.filter(key="j0").update(created_at=timezone.now() - dt.timedelta(seconds=90))
    out = io.StringIO()
    call_command("taskclaim_inspect", "--json", stdout=out)
    [jobs] = json.loads(out.getvalue())["queues"]
    assert (jobs["queue"], jobs["due"], jobs["deferred"], jobs["running"]) == ("jobs", 2, 1, 0)
    assert 85 < jobs["oldest_due_age"] < 300
    out = io.StringIO()
    call_command("taskclaim_inspect", stdout=out)
    assert out.getvalue().splitlines()[1].split()[:4] == ["jobs", "2", "1", "0"]
