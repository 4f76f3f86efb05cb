"""Errors survive the trip through pickle and through a result backend that rebuilds from the message."""

from __future__ import annotations

import pickle

import pytest

from django_taskclaim.exceptions import PayloadMismatch, StaleClaim, TaskBusy, TaskFailed
from django_taskclaim.models import Task


def pickled(error: Exception) -> Exception:
    return pickle.loads(pickle.dumps(error))  # noqa: S301 (our own bytes, in-process)


@pytest.mark.django_db
def test_errors_round_trip() -> None:
    task = Task.objects.claim("job", owner="w1").task
    errors = [
        StaleClaim("job", "acme", 3, "complete"),
        PayloadMismatch("job", "", "a" * 64, "b" * 64),
        TaskBusy(task),
        TaskFailed(task),
    ]
    for error in errors:
        copy = pickled(error)
        assert type(copy) is type(error) and str(copy) == str(error)
        rebuilt = type(error)(str(error))  # how JSON result backends recreate an exception
        assert str(rebuilt) == str(error)
    stale = pickled(errors[0])
    assert (stale.key, stale.tenant, stale.token, stale.action) == ("job", "acme", 3, "complete")
    assert pickled(errors[2]).task.key == "job"  # type: ignore[attr-defined]
    assert StaleClaim(str(errors[0])).token is None
