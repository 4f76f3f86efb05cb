"""django_taskclaim.W020: a SQLite busy timeout too short for concurrent workers."""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections
from django.test import override_settings

from django_taskclaim import checks

pytestmark = pytest.mark.skipif(connections["default"].vendor != "sqlite", reason="SQLite's busy timeout")


def databases(**options: Any) -> dict[str, Any]:
    """The suite's DATABASES with the default alias's OPTIONS replaced."""
    value = copy.deepcopy(settings.DATABASES)
    value["default"]["OPTIONS"] = options
    return value


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@pytest.mark.parametrize(("options", "shown"), [
    ({}, "5 s (the default)"),
    ({"timeout": 5}, "5 s"),
    ({"timeout": 29.5}, "29.5 s"),
    ({"timeout": "30"}, "'30' (not a number of seconds)"),
])
def test_w020_short_busy_timeout(options: dict[str, Any], shown: str) -> None:
    with override_settings(DATABASES=databases(**options)):
        (warning,) = checks.check_database()
    assert warning.id == "django_taskclaim.W020" and shown in warning.msg
    assert "'timeout'] = 30" in warning.hint


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@pytest.mark.parametrize("timeout", [30, 60.0])
def test_w020_silent_with_the_recommended_timeout(timeout: float) -> None:
    with override_settings(DATABASES=databases(timeout=timeout)):
        assert checks.check_database() == []


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@pytest.mark.django_db  # Django 6.1+: `check` runs the model checks on every database (a query on SQLite)
def test_w020_is_registered() -> None:
    out, err = io.StringIO(), io.StringIO()
    with override_settings(DATABASES=databases()):
        call_command("check", stdout=out, stderr=err)
    assert "django_taskclaim.W020" in out.getvalue() + err.getvalue()
