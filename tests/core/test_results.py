"""Results: the configurable JSON encoder, and a result that cannot be stored never runs the work twice."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid

import pytest
from django.test import override_settings

from django_taskclaim import run_once
from django_taskclaim.checks import check_settings
from django_taskclaim.exceptions import InvalidResult, TaskFailed
from django_taskclaim.models import Attempt, Task
from tests.conftest import expire, require_module

pytestmark = pytest.mark.django_db(transaction=True)


class SetEncoder(json.JSONEncoder):
    """A user's encoder: sets as sorted lists (deterministic, so fingerprints stay stable)."""

    def default(self, o: object) -> object:
        if isinstance(o, set | frozenset):
            return sorted(o)
        return super().default(o)


def test_decimal_datetime_and_uuid_are_stored_and_read_back_as_strings() -> None:
    when = dt.datetime(2026, 12, 3, 5, 30, 0, 123000, tzinfo=dt.UTC)
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    result = run_once("job", lambda: {"amount": decimal.Decimal("10.50"), "at": when, "id": ident,
                                      "day": dt.date(2026, 12, 3)})
    stored = Task.objects.get(key="job").result
    assert stored == {"amount": "10.50", "at": "2026-12-03T05:30:00.123Z", "id": str(ident), "day": "2026-12-03"}
    assert result["amount"] == decimal.Decimal("10.50")  # the caller gets the value func returned
    # A duplicate call gets what the database holds: the strings.
    assert run_once("job", lambda: pytest.fail("ran twice")) == stored


@pytest.mark.parametrize(
    ("result", "problem"),
    [
        ({"tags": {"a", "b"}}, "not JSON-serialisable"),
        ("nul\x00byte", "NUL character"),
        ({"k\x00": 1}, "NUL character"),
        ("lone \ud800 surrogate", "lone surrogate"),
        ({"x": float("nan")}, "not JSON-serialisable"),
        ("x" * 2000, "bytes of JSON; TASKCLAIM_MAX_RESULT_BYTES allows 1000"),
    ],
)
def test_run_once_with_an_unstorable_result_fails_the_task_and_never_runs_again(
    settings, result: object, problem: str,  # type: ignore[no-untyped-def]
) -> None:
    settings.TASKCLAIM_MAX_RESULT_BYTES = 1000
    runs: list[int] = []

    def effect() -> object:
        runs.append(1)
        return result

    with pytest.raises(InvalidResult, match=problem):
        run_once("job", effect, lease=1)
    task = Task.objects.get(key="job")
    assert task.status == "failed" and problem.split(";")[0] in task.error
    assert task.error.startswith("InvalidResult: result ")
    assert list(Attempt.objects.values_list("outcome", flat=True)) == ["failed"]
    # Every later call, even after the lease would have expired, gets TaskFailed and runs nothing.
    expire(task)
    for _ in range(3):
        with pytest.raises(TaskFailed, match="InvalidResult"):
            run_once("job", effect, lease=1)
    assert runs == [1]


def test_a_backslash_before_u0000_text_is_not_a_nul() -> None:
    # The JSON of "\\u0000" (a backslash, then the letters) is "\\\\u0000": storable everywhere.
    assert run_once("job", lambda: "\\u0000") == "\\u0000"
    assert Task.objects.get(key="job").result == "\\u0000"


def test_the_encoder_is_configurable() -> None:
    with override_settings(TASKCLAIM_JSON_ENCODER="tests.core.test_results.SetEncoder"):
        assert run_once("job", lambda: {"tags": {"b", "a"}}) == {"tags": {"a", "b"}}
        Task.objects.claim("other", payload={"s": {2, 1}})
    assert Task.objects.get(key="job").result == {"tags": ["a", "b"]}
    assert Task.objects.get(key="other").payload == {"s": [1, 2]}


def test_complete_alone_refuses_and_keeps_the_claim() -> None:
    """``claim.complete`` leaves the decision to its caller: nothing written, the claim still held."""
    claim = Task.objects.claim("job").claim
    with pytest.raises(InvalidResult, match="NUL"):
        claim.complete("a\x00b")
    with pytest.raises(InvalidResult, match="result_ref contains a NUL"):
        claim.complete(result_ref="s3://bucket/\x00")
    with pytest.raises(InvalidResult, match="result_ref contains a lone surrogate"):
        claim.complete(result_ref="s3://\udcff")
    assert Task.objects.get(key="job").status == "running"
    claim.complete("ok", result_ref="s3://bucket/key")
    assert Task.objects.values_list("status", "result", "result_ref").get() == ("succeeded", "ok", "s3://bucket/key")


@pytest.mark.parametrize(
    ("value", "problem"),
    [("no.such.Encoder", "cannot be imported"), ("json.dumps", "not a json.JSONEncoder subclass"), (42, "dotted path")],
)
def test_e006_bad_encoder(value: object, problem: str) -> None:
    with override_settings(TASKCLAIM_JSON_ENCODER=value):
        (error,) = check_settings()
    assert error.id == "django_taskclaim.E006" and problem in error.msg and error.hint


require_module("celery", "celery (pip install 'django-taskclaim[celery]')")

from django_taskclaim.celery import claimed_task  # noqa: E402


@claimed_task(key="celery-{0}")
def returns(key: str, value: object) -> object:
    return value


@pytest.mark.parametrize("value", [{"s": {1}}, "nul\x00", "\ud800"])
def test_celery_bridge_fails_the_task_through_the_same_helper(value: object) -> None:
    with pytest.raises(InvalidResult):
        returns("x", value)
    task = Task.objects.get(key="celery-x")
    assert task.status == "failed" and "InvalidResult" in task.error
    with pytest.raises(TaskFailed):
        returns("x", "fine now")


@claimed_task(key="raises-{0}")
def raises(key: str, text: str) -> None:
    raise ValueError(text)


@pytest.mark.parametrize("text", ["nul\x00inside", "lone \ud800", "e" * 50_000])
def test_celery_bridge_records_any_error_text_and_never_leaves_the_task_running(text: str) -> None:
    with pytest.raises(ValueError):
        raises("x", text)
    task = Task.objects.get(key="raises-x")
    assert task.status == "failed" and task.error.startswith("ValueError: ")
    assert "\x00" not in task.error and len(task.error) <= 10_000
