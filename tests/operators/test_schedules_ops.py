"""What an operator meets of ``TASKCLAIM_SCHEDULES``: its system checks (E301-E305), the
``taskclaim_scheduler`` command, ``taskclaim_worker --schedule``, the admin's schedules page and
the lag gauge."""

from __future__ import annotations

import io
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_taskclaim.management.base import database_now
from django_taskclaim.models import Task
from django_taskclaim.schedules import checks as schedule_checks
from django_taskclaim.schedules.firing import fire
from django_taskclaim.schedules.spec import parse
from django_taskclaim.schedules.status import standing

TICK = "tests.testapp.tasks.tick"


def errors(schedules: Any) -> list[tuple[str, str]]:
    with override_settings(TASKCLAIM_SCHEDULES=schedules):
        return [(m.id, m.msg) for m in schedule_checks.check_schedules()]


def test_a_valid_configuration_passes() -> None:
    assert errors({"a": {"task": TICK, "cron": "*/5 * * * *", "timezone": "Europe/Paris", "kwargs": {"label": "x"}},
                   "b": {"queue": "sweeps", "payload": {"n": 1}, "every": 60, "catch_up": "all",
                         "catch_up_limit": 10}}) == []


@pytest.mark.parametrize(("entry", "field"), [
    ({"task": TICK, "every": 5, "cron_expr": "* * * * *"}, "'cron_expr']: unknown key"),
    ({"task": TICK, "every": 5, "cron": "* * * * *"}, "'cron']: give either 'cron'"),
    ({"task": TICK}, "'cron']: give either 'cron'"),
    ({"task": TICK, "every": 0}, "'every']: must be a whole number"),
    ({"task": TICK, "every": 5, "catch_up": "some"}, "'catch_up']: must be one of latest, all, skip"),
    ({"task": TICK, "every": 5, "catch_up_limit": 0}, "'catch_up_limit']"),
    ({"every": 5}, "'task']: give either 'task'"),
    ({"task": TICK, "queue": "q", "every": 5}, "'task']: give either 'task'"),
    ({"queue": "q", "every": 5, "args": [1]}, "'args']: is for a Django task"),
    ({"task": TICK, "every": 5, "payload": 1}, "'payload']: is for a handler"),
    ({"task": TICK, "every": 5, "args": "x"}, "'args']: must be a list"),
])
def test_e301_a_schedule_field_that_cannot_be_used(entry: dict[str, Any], field: str) -> None:
    [(check_id, msg)] = errors({"nightly": entry})
    assert check_id == "django_taskclaim.E301" and msg.startswith("TASKCLAIM_SCHEDULES['nightly'][") and field in msg


def test_e301_names_a_bad_schedule_name_and_every_bad_schedule() -> None:
    found = errors({"has space": {"task": TICK, "every": 5}, "ok": {"task": TICK, "every": 5},
                    "other": {"task": TICK}})
    assert [i for i, _ in found] == ["django_taskclaim.E301"] * 2
    assert "'has space'" in found[0][1] and "'other'" in found[1][1]
    assert errors({"Beat": {"task": TICK, "every": 5}, "beat": {"task": TICK, "every": 5}}) == [
        ("django_taskclaim.E301", "TASKCLAIM_SCHEDULES['beat']: differs from the schedule 'Beat' only in case")]
    assert errors([{"task": TICK, "every": 5}]) == [
        ("django_taskclaim.E301", "TASKCLAIM_SCHEDULES must be a dict of schedules, not list")]


def test_e302_a_bad_cron_expression() -> None:
    [(check_id, msg)] = errors({"nightly": {"task": TICK, "cron": "61 * * * *"}})
    assert check_id == "django_taskclaim.E302" and "TASKCLAIM_SCHEDULES['nightly']['cron']: '61 * * * *'" in msg


def test_e303_an_unknown_timezone() -> None:
    [(check_id, msg)] = errors({"nightly": {"task": TICK, "every": 5, "timezone": "Mars/Olympus"}})
    assert check_id == "django_taskclaim.E303" and "['timezone']: unknown timezone 'Mars/Olympus'" in msg


@pytest.mark.parametrize(("path", "problem"), [
    ("tests.testapp.tasks.no_such_task", "does not import"),
    ("no_such_module.tick", "does not import"),
    ("tests.testapp.tasks.Path", "is not a task"),
])
def test_e304_a_task_that_does_not_import_or_is_not_a_task(path: str, problem: str) -> None:
    [(check_id, msg)] = errors({"nightly": {"task": path, "every": 5}})
    assert check_id == "django_taskclaim.E304" and msg.startswith("TASKCLAIM_SCHEDULES['nightly']['task']: ")
    assert problem in msg


def test_e305_a_cron_schedule_without_cronsim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cronsim", None)  # an import of it raises ImportError
    [(check_id, msg)] = errors({"nightly": {"task": TICK, "cron": "* * * * *"}})
    assert check_id == "django_taskclaim.E305" and "pip install 'django-taskclaim[schedules]'" in msg
    assert errors({"nightly": {"task": TICK, "every": 60}}) == []  # an interval needs no cronsim


@pytest.mark.django_db(transaction=True)
def test_the_checks_are_registered() -> None:
    with override_settings(TASKCLAIM_SCHEDULES={"nightly": {"task": TICK, "cron": "nope"}}), \
            pytest.raises(Exception, match="E302"):
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())


# -- the commands ----------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_scheduler_once_fires_what_is_due_and_a_second_run_nothing() -> None:
    schedule = parse("beat", {"task": TICK, "every": 60})
    now = datetime.now(UTC)
    fire(schedule, now - timedelta(seconds=300))  # fired before: three ticks missed since
    with override_settings(TASKCLAIM_SCHEDULES={"beat": {"task": TICK, "every": 60}}):
        out = io.StringIO()
        call_command("taskclaim_scheduler", "--once", "--json", stdout=out)
        assert json.loads(out.getvalue()) == {"fired": 1}  # catch_up "latest": the newest missed only
        out = io.StringIO()
        call_command("taskclaim_scheduler", "--once", "--json", stdout=out)
        assert json.loads(out.getvalue()) == {"fired": 0}
    assert Task.objects.filter(key__endswith="schedule%3Abeat").count() == 2


@pytest.mark.django_db(transaction=True)
def test_scheduler_once_fires_a_schedule_that_never_fired() -> None:
    # Issue 40, item 7: run from cron, --once keeps no memory; a schedule with no tick in the
    # database fired nothing, run after run, for ever. It fires its newest tick, once.
    schedule = parse("beat", {"task": TICK, "every": 3600})
    with override_settings(TASKCLAIM_SCHEDULES={"beat": {"task": TICK, "every": 3600}}):
        runs = []
        for _ in range(2):
            out = io.StringIO()
            call_command("taskclaim_scheduler", "--once", "--json", stdout=out)
            runs.append(json.loads(out.getvalue()))
    assert runs == [{"fired": 1}, {"fired": 0}]
    [key] = Task.objects.filter(key__endswith="schedule%3Abeat").values_list("key", flat=True)
    assert schedule.tick_of(key) == schedule.latest(database_now(), 1)[0]  # this hour's tick


@pytest.mark.django_db(transaction=True)
def test_scheduler_refuses_a_bad_configuration_as_a_usage_error() -> None:
    with override_settings(TASKCLAIM_SCHEDULES={"beat": {"task": "tests.testapp.tasks.Path", "every": 1}}), \
            pytest.raises(CommandError, match=r"TASKCLAIM_SCHEDULES\['beat'\]\['task'\]") as raised:
        call_command("taskclaim_scheduler", "--once", "--skip-checks")
    assert raised.value.returncode == 2
    with override_settings(TASKCLAIM_SCHEDULES={}), pytest.raises(CommandError, match="names no schedule"):
        call_command("taskclaim_scheduler", "--once")


@pytest.mark.django_db(transaction=True)
def test_worker_with_schedule_fires_the_ticks_and_runs_them() -> None:
    with override_settings(TASKCLAIM_SCHEDULES={"beat": {"task": TICK, "every": 1}}):
        out = io.StringIO()
        call_command("taskclaim_worker", "--schedule", "--max-tasks", "1", "--json", stdout=out)
    assert json.loads(out.getvalue())["succeeded"] == 1
    row = Task.objects.get(status=Task.Status.SUCCEEDED)
    assert row.key.endswith(":schedule%3Abeat") and row.result["key"] == row.key


# -- admin and metrics -----------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_the_admin_lists_the_schedules_with_last_and_next_tick(client: Any) -> None:
    user = User.objects.create_superuser("admin", "a@example.com")
    client.force_login(user)
    now = datetime.now(UTC).replace(microsecond=0)
    schedule = parse("beat", {"task": TICK, "every": 3600})
    fire(schedule, now - timedelta(seconds=now.timestamp() % 3600))
    row = Task.objects.get()
    with override_settings(TASKCLAIM_SCHEDULES={"beat": {"task": TICK, "every": 3600},
                                                "nightly": {"queue": "q", "cron": "0 3 * * *",
                                                            "timezone": "Europe/Paris"}}):
        page = client.get("/admin/django_taskclaim/task/schedules/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "beat" in html and "every 3600 s" in html and "nightly" in html and "0 3 * * *" in html
    assert f"/admin/django_taskclaim/task/{row.pk}/change/" in html and "Pending" in html
    assert "Europe/Paris" in html


@pytest.mark.django_db(transaction=True)
def test_the_admin_page_needs_the_view_permission(client: Any) -> None:
    user = User.objects.create_user("staff", is_staff=True)
    client.force_login(user)
    assert client.get("/admin/django_taskclaim/task/schedules/").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_the_lag_is_how_long_the_oldest_missing_tick_has_waited() -> None:
    schedule = parse("beat", {"queue": "q", "every": 10})
    now = datetime(2026, 12, 6, 12, 0, 35, tzinfo=UTC)
    fire(schedule, now - timedelta(seconds=35))
    assert standing(schedule, now).lag == 25.0  # 12:00:10 is due and has no task
    fire(schedule, now - timedelta(seconds=5))
    found = standing(schedule, now)
    assert found.lag == 0.0 and found.next_tick == now + timedelta(seconds=5)
    assert found.last_tick == now - timedelta(seconds=5) and found.last_task is not None


@pytest.mark.django_db(transaction=True)
def test_the_lag_gauge() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from django_taskclaim.metrics import ScheduleCollector

    registry = CollectorRegistry()
    registry.register(ScheduleCollector())
    with override_settings(TASKCLAIM_SCHEDULES={"beat": {"queue": "q", "every": 10}}):
        fire(parse("beat", {"queue": "q", "every": 10}), datetime.now(UTC) - timedelta(seconds=100))
        text = generate_latest(registry).decode()
    line = next(each for each in text.splitlines() if each.startswith("taskclaim_schedule_lag_seconds{"))
    assert 'schedule="beat"' in line and 80 < float(line.split()[-1]) < 100
