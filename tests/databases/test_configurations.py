"""Supported Django configurations keep "one task, one effect" (docs/configurations.md).

The runner's ``--config NAME`` (tests/configurations.py) runs this file and the process races
of test_concurrency.py in each configuration. Tests that need one configuration skip in the
others; the rest run everywhere, the default suite included.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections, transaction

from devtools.threads import call_in_thread
from django_taskclaim import checks
from django_taskclaim.conf import settings as tc_settings
from django_taskclaim.exceptions import StaleClaim
from django_taskclaim.models import Attempt, Task
from tests.conftest import expire
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True)]

CONFIG = settings.TEST_CONFIG


def only_in(*configs: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(CONFIG not in configs, reason=f"configuration {' or '.join(configs)} only")


def task_db() -> Any:
    return connections[tc_settings.DATABASE]


def in_other_thread(func: Callable[[], Any]) -> Any:
    """Run ``func`` on another thread, i.e. on another database connection, and return its result
    (``TimeoutError`` after 60 s: a daemon thread, left behind, cannot keep pytest from exiting)."""

    def run() -> Any:
        try:
            return func()
        finally:
            connections.close_all()

    return call_in_thread(run, timeout=60, what="the other connection's call")


# ---- Each configuration is what it claims to be ---------------------------------------------

def test_the_configuration_is_in_effect() -> None:
    db = task_db()
    options = db.settings_dict.get("OPTIONS", {})
    if CONFIG == "pool":
        assert db.pool is not None and options["pool"]
    elif CONFIG == "server_side_binding":
        with db.cursor() as cursor:
            assert type(cursor.cursor).__name__ == "ServerBindingCursor"
    elif CONFIG == "pgbouncer":
        with db.cursor() as cursor:
            # The server sees the connection arrive from PgBouncer, not on the port we dialled.
            cursor.execute("SELECT inet_server_port()")
            assert str(cursor.fetchone()[0]) != str(db.settings_dict["PORT"])
        assert tc_settings.PREPARED_STATEMENTS is False and db.settings_dict["DISABLE_SERVER_SIDE_CURSORS"]
    elif CONFIG == "atomic_requests":
        assert db.settings_dict["ATOMIC_REQUESTS"]
    elif CONFIG == "second_db":
        assert tc_settings.DATABASE == "tasks" and Task.objects.db == "tasks"
    # default and autocommit_off: settings as in tests/settings.py (autocommit is the callers')


def test_the_system_checks_pass() -> None:
    """The documented settings of each configuration raise no check of django-taskclaim."""
    assert checks.check_database() == [] and checks.check_settings() == []


def test_workers_run_as_the_configuration_says(processes, spawn) -> None:  # type: ignore[no-untyped-def]
    """The race workers of test_concurrency.py turn autocommit off where the configuration says so."""
    proc = spawn("race", "probe")
    [ready] = processes.go(proc)
    assert ready["autocommit"] is (CONFIG != "autocommit_off"), (ready, proc.stderr())
    assert proc.finish(60)["claimed"]
    assert Task.objects.get(key="probe").status == "running"  # committed by the worker


# ---- ATOMIC_REQUESTS (and every other configuration): views raced by processes --------------

@pytest.mark.parametrize("on_busy", ["wait", "raise"])
def test_racing_requests_run_the_view_once(processes, on_busy: str) -> None:  # type: ignore[no-untyped-def]
    """Six processes POST one key at once: one runs the work; the others get its result or 409.

    With ATOMIC_REQUESTS (or callers with autocommit off) the claim is invisible until the
    winner's request commits: the others wait on it (PostgreSQL: the unique index; SQLite: the
    write lock, within its busy timeout), then find the task SUCCEEDED and return the stored
    result, so none sees it busy. Elsewhere a request that finds it running waits for the
    result (``on_busy="wait"``) or answers 409 (``"raise"``).
    """
    # Six processes forked from one that set Django up (tests/programs/fleet.py): each its own
    # pid and connection, Django's start-up paid once.
    fleet = processes.start("tests.programs.fleet", "6", "tests.programs.claimer", "request",
                            f"/race/report-7/?work=0.5&on_busy={on_busy}", group=True)
    ready = [fleet.event("ready", timeout=60) for _ in range(6)]
    assert len({r["pid"] for r in ready}) == 6
    fleet.send("go")
    responses = [fleet.event("response", timeout=120) for _ in range(6)]
    fleet.end_input()
    fleet.finish(120)
    served = [r for r in responses if r["status"] == 200]
    if on_busy == "wait" or CONFIG in ("atomic_requests", "autocommit_off"):
        assert len(served) == 6, responses
    else:
        assert served and all(r["status"] == 409 and r["body"] == {"busy": True}
                              for r in responses if r["status"] != 200), responses
    assert len({json.dumps(r["body"]["result"]) for r in served}) == 1, responses
    assert all(r["body"]["atomic"] is (CONFIG == "atomic_requests") for r in served), responses
    assert Effect.objects.filter(task_key="report-7").count() == 1
    task = Task.objects.get(key="report-7")
    assert (task.status, task.attempts, task.fencing_token) == ("succeeded", 1, 1)


# ---- A second database alias ----------------------------------------------------------------

@only_in("second_db")
def test_task_tables_are_migrated_to_the_task_database_only() -> None:
    tasks_tables = set(connections["tasks"].introspection.table_names())
    default_tables = set(connections["default"].introspection.table_names())
    assert {"django_taskclaim_task", "django_taskclaim_attempt"} <= tasks_tables
    assert "django_taskclaim_task" not in default_tables and "auth_user" in default_tables
    assert "auth_user" not in tasks_tables


@only_in("second_db")
def test_claims_fenced_writes_and_commands_use_the_task_database() -> None:
    claim = Task.objects.claim("invoice-1", lease=30).claim
    assert claim is not None and claim.using == "tasks"
    with claim.fenced():
        Effect.objects.create(task_key=claim.key, token=claim.token, worker="w")
        claim.complete({"ok": True})
    assert Task.objects.using("tasks").get(key="invoice-1").status == "succeeded"
    assert Effect.objects.using("tasks").filter(task_key="invoice-1").count() == 1

    stale = Task.objects.claim("invoice-2", lease=30).claim
    expire(stale)
    out = io.StringIO()
    call_command("taskclaim_reclaim", stdout=out)
    assert Task.objects.get(key="invoice-2").status == "pending"
    with pytest.raises(StaleClaim), stale.fenced():
        pytest.fail("a reclaimed claim must not enter fenced()")
    out = io.StringIO()
    call_command("taskclaim_inspect", "invoice-1", "--json", stdout=out)
    assert json.loads(out.getvalue())["task"]["status"] == "succeeded"
    out = io.StringIO()
    call_command("taskclaim_audit", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert report["overlaps"]["count"] == 0 and report["stale_writes"]["count"] == 1, report
    Task.objects.filter(key="invoice-1").update(updated_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    call_command("taskclaim_purge", "--older-than", "1d", stdout=io.StringIO())
    assert list(Task.objects.using("tasks").values_list("key", flat=True)) == ["invoice-2"]


# ---- Callers with autocommit off ------------------------------------------------------------

@pytest.fixture
def autocommit_off() -> Any:
    """The caller's connection to the task database with autocommit off, as set_autocommit(False) leaves it."""
    alias = tc_settings.DATABASE
    transaction.set_autocommit(False, using=alias)
    try:
        yield alias
    finally:
        transaction.rollback(using=alias)
        transaction.set_autocommit(True, using=alias)


def status_elsewhere(key: str) -> str | None:
    """The task's status as another connection sees it (only what was committed)."""
    return in_other_thread(lambda: Task.objects.filter(key=key).values_list("status", flat=True).first())


def test_autocommit_off_a_claim_counts_once_committed(autocommit_off: str) -> None:
    claim = Task.objects.claim("job", owner="caller").claim
    assert claim is not None
    assert status_elsewhere("job") is None  # not committed: nobody else sees it yet
    transaction.commit(using=autocommit_off)
    assert status_elsewhere("job") == "running"


def test_autocommit_off_a_rolled_back_claim_never_happened(autocommit_off: str) -> None:
    assert Task.objects.claim("job", owner="caller").claimed
    transaction.rollback(using=autocommit_off)
    assert status_elsewhere("job") is None
    other = in_other_thread(lambda: Task.objects.claim("job", owner="other").claim)
    assert other is not None and other.token == 1  # the rolled-back claim took no token


def test_autocommit_off_fenced_writes_and_completion_commit_with_the_caller(autocommit_off: str) -> None:
    claim = Task.objects.claim("job", owner="caller").claim
    assert claim is not None
    transaction.commit(using=autocommit_off)
    with claim.fenced():
        Effect.objects.create(task_key="job", token=claim.token, worker="caller")
        claim.complete({"n": 1})
    assert status_elsewhere("job") == "running"  # fenced() does not commit the caller's transaction
    transaction.rollback(using=autocommit_off)  # the caller changes its mind: both go
    assert Task.objects.get(key="job").status == "running" and not Effect.objects.filter(task_key="job").exists()
    with claim.fenced():  # the claim still owns the task: try again, and commit this time
        Effect.objects.create(task_key="job", token=claim.token, worker="caller")
        claim.complete({"n": 2})
    transaction.commit(using=autocommit_off)
    assert status_elsewhere("job") == "succeeded"
    assert Effect.objects.filter(task_key="job").count() == 1 and Task.objects.get(key="job").result == {"n": 2}


def test_autocommit_off_a_stale_claim_writes_nothing(autocommit_off: str) -> None:
    old = Task.objects.claim("job", owner="old", lease=30).claim
    transaction.commit(using=autocommit_off)
    expire(old)
    transaction.commit(using=autocommit_off)
    new = in_other_thread(lambda: Task.objects.claim("job", owner="new").claim)
    assert new is not None and new.token == 2
    with pytest.raises(StaleClaim), old.fenced():
        Effect.objects.create(task_key="job", token=old.token, worker="old")
    transaction.commit(using=autocommit_off)
    assert not Effect.objects.filter(task_key="job").exists()
    assert Attempt.objects.get(task__key="job", token=1).stale_writes == 1


@only_in("pgbouncer")
def test_keepalive_inside_a_transaction_changes_no_setting_of_other_clients() -> None:
    """Issue 25.8: the heartbeats of a keepalive inside the caller's transaction limit their own
    lock waits; behind PgBouncer in transaction mode another client's statements ran on the same
    server sessions, and got ``canceling statement due to lock timeout``."""
    claim = Task.objects.claim("job", lease=0.6).claim  # committed before the transaction
    assert claim is not None
    seen: set[str] = set()
    expiries: set[Any] = set()

    def other_client() -> None:
        deadline = dt.datetime.now() + dt.timedelta(seconds=30)
        with task_db().cursor() as cursor:
            while len(expiries) < 6:  # several heartbeats, each in a transaction of its own
                assert dt.datetime.now() < deadline, "the keepalive did not heartbeat"
                cursor.execute("SHOW lock_timeout")
                seen.add(str(cursor.fetchone()[0]))
                cursor.execute("SELECT lease_expires_at FROM django_taskclaim_task WHERE id = %s", [claim.task_id])
                expiries.add(cursor.fetchone()[0])

    with transaction.atomic(using=tc_settings.DATABASE), claim.keepalive(interval=0.05):
        in_other_thread(other_client)
    assert seen == {"0"}, seen
    claim.complete("ok")
