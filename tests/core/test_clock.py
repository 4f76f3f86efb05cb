"""Expressions of the database clock used for cutoffs (never the local clock)."""

from __future__ import annotations

import pytest

from django_taskclaim.models import Task
from django_taskclaim.store import DbNow, DbNowPlus

pytestmark = pytest.mark.django_db


def test_db_now_plus_shifts_the_database_clock() -> None:
    Task.objects.ensure("job")
    Task.objects.filter(key="job").update(updated_at=DbNowPlus(-10))
    rows = Task.objects.filter(key="job")
    assert rows.filter(updated_at__lt=DbNowPlus(-5)).exists()
    assert not rows.filter(updated_at__lt=DbNowPlus(-20)).exists()
    assert rows.filter(updated_at__lt=DbNow()).exists()
    Task.objects.filter(key="job").update(updated_at=DbNowPlus(3600))
    assert rows.filter(updated_at__gt=DbNowPlus(3500)).exists()
