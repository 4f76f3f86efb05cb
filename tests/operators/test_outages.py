"""``django_taskclaim.outages``: the one-line message that names a task database out of reach once,
and its log, one line per change of state at a bounded rate (tests/operators/test_database_down.py
meets it with a server stopped for real). In-process, every configuration."""

from __future__ import annotations

import logging
import pickle

import pytest
from django.db import OperationalError

from django_taskclaim import outages
from django_taskclaim.exceptions import DatabaseUnreachable, TaskClaimError


def test_outages_log_a_change_once_and_a_flapping_database_at_a_bounded_rate(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(outages.time, "monotonic", lambda: clock[0])
    outages.forget()
    caplog.set_level(logging.INFO, logger="django_taskclaim")
    error = OperationalError("connection failed: refused\n\tIs the server running?")
    said = "task database 'x' cannot be reached: connection failed: refused Is the server running?"
    for _ in range(5):
        assert outages.down("x", error) == said
    outages.up("x")
    outages.up("x")
    outages.down("x", error)  # down again within MIN_GAP of the last line saying so: not said
    outages.up("x")  # nor its recovery
    clock[0] += outages.MIN_GAP
    outages.down("x", error)
    outages.up("x")
    back = "task database 'x' answers again"
    down_line = f"{said}; its tenants wait, the other task databases go on"
    assert [r.getMessage() for r in caplog.records] == [down_line, back, down_line, back]
    outages.forget()


def test_database_unreachable_names_its_database_once_and_survives_pickling() -> None:
    error = DatabaseUnreachable("shard2", "did not answer within 10 s (TASKCLAIM_DATABASE_TIMEOUT)")
    assert str(error) == "task database 'shard2' did not answer within 10 s (TASKCLAIM_DATABASE_TIMEOUT)"
    assert isinstance(error, TaskClaimError) and isinstance(error, OperationalError)
    assert outages.describe("shard2", error) == str(error)  # named already: not named twice
    again = pickle.loads(pickle.dumps(error))  # noqa: S301 (our own bytes, in-process)
    assert (type(again), again.alias, str(again)) == (DatabaseUnreachable, "shard2", str(error))
