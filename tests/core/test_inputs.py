"""Input the database would reject is refused up front with the library's errors, writing nothing;
the failure path stores any error text."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import override_settings
from django.urls import reverse

from django_taskclaim import TaskKey
from django_taskclaim.checks import check_settings
from django_taskclaim.exceptions import (
    InvalidArgument,
    InvalidLease,
    InvalidPayload,
    InvalidTaskKey,
    PayloadMismatch,
    TaskClaimError,
)
from django_taskclaim.models import Attempt, Task
from django_taskclaim.values import MIN_LEASE

pytestmark = pytest.mark.django_db

WEEK = 7 * 24 * 3600


def rows() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    return list(Task.objects.order_by("pk").values()), list(Attempt.objects.order_by("pk").values())


# -- leases ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("lease", [1e12, WEEK + 1, dt.timedelta(days=8), 10**400, 0.05, dt.timedelta(milliseconds=1)])
def test_absurd_leases_are_refused_before_anything_is_written(lease: object) -> None:
    with pytest.raises(InvalidLease, match="TASKCLAIM_MAX_LEASE|shorter than the minimum"):
        Task.objects.claim("job", lease=lease)  # type: ignore[arg-type]
    with pytest.raises(InvalidLease):
        Task.objects.claim_next(lease=lease)  # type: ignore[arg-type]
    assert rows() == ([], [])


def test_a_huge_heartbeat_raises_before_writing() -> None:
    claim = Task.objects.claim("job", lease=30).claim
    before = rows()
    for lease in (1e12, float("inf"), 0.001):
        with pytest.raises(InvalidLease):
            claim.heartbeat(lease)
    assert rows() == before
    assert claim.lease == 30


def test_the_longest_lease_allowed_loads_everywhere(admin_client) -> None:  # type: ignore[no-untyped-def]
    Task.objects.claim("longest", lease=WEEK)
    Task.objects.claim("shortest", lease=MIN_LEASE)
    task = Task.objects.get(key="longest")
    assert task.lease_remaining() == pytest.approx(WEEK, abs=60)
    assert admin_client.get(reverse("admin:django_taskclaim_task_changelist")).status_code == 200
    assert admin_client.get(reverse("admin:django_taskclaim_task_change", args=[task.pk])).status_code == 200
    call_command("taskclaim_inspect", "longest", stdout=__import__("io").StringIO())


def test_max_lease_is_a_setting(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKCLAIM_MAX_LEASE = 60
    with pytest.raises(InvalidLease, match=r"longer than TASKCLAIM_MAX_LEASE \(60 s\)"):
        Task.objects.claim("job", lease=61)
    assert Task.objects.claim("job", lease=60).claimed


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [({"TASKCLAIM_MAX_LEASE": 1e12}, "must be at most"),
     ({"TASKCLAIM_MAX_LEASE": 60, "TASKCLAIM_DEFAULT_LEASE": 120}, "longer than TASKCLAIM_MAX_LEASE"),
     ({"TASKCLAIM_DEFAULT_LEASE": 0.01}, "shorter than the minimum"),
     ({"TASKCLAIM_MAX_ATTEMPTS": 2**31}, "must be at most"),
     ({"TASKCLAIM_MAX_PAYLOAD_BYTES": "1MB"}, "expected int")],
)
def test_e005_bounds(overrides: dict[str, object], problem: str) -> None:
    with override_settings(**overrides):
        (error,) = check_settings()
    assert error.id == "django_taskclaim.E005" and problem in error.msg


# -- text and integers the database cannot store ---------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"owner": "w" * 256}, InvalidArgument, "owner is 256 characters long; the limit is 255"),
        ({"owner": "a\x00b"}, InvalidArgument, "owner contains a NUL character at position 1"),
        ({"owner": "\ud800"}, InvalidArgument, "owner contains a lone surrogate"),
        ({"owner": 7}, InvalidArgument, "owner must be a string"),
        ({"delivery_id": "d" * 256}, InvalidArgument, "delivery_id is 256 characters long"),
        ({"delivery_id": "\x00"}, InvalidArgument, "delivery_id contains a NUL"),
        ({"max_attempts": 2**31}, InvalidArgument, "max_attempts = 2147483648 is too large"),
        ({"max_attempts": True}, InvalidArgument, "positive integer"),
        ({"payload": {"a": "\ud800"}}, InvalidPayload, "payload contains a lone surrogate"),
        ({"payload": {"\ud800": 1}}, InvalidPayload, "lone surrogate"),
        ({"payload": "nul\x00"}, InvalidPayload, "payload contains a NUL character"),
        ({"payload": {1: 1, "a": 2}}, InvalidPayload, "not JSON-serialisable"),
        ({"payload": "x" * 2000}, InvalidPayload, "TASKCLAIM_MAX_PAYLOAD_BYTES allows 1000"),
        ({"key": "lone\ud800"}, InvalidTaskKey, "non-printable"),
        ({"tenant": "t\udcff"}, InvalidTaskKey, "non-printable"),
    ],
)
def test_text_and_numbers_the_database_rejects_are_refused(settings, kwargs, error, message) -> None:  # type: ignore[no-untyped-def]
    settings.TASKCLAIM_MAX_PAYLOAD_BYTES = 1000
    Task.objects.claim("other", owner="w1", payload={"p": 1})
    before = rows()
    with pytest.raises(error, match=message) as caught:
        Task.objects.claim(**{"key": "job", **kwargs})
    assert isinstance(caught.value, TaskClaimError) and isinstance(caught.value, ValueError)
    if "max_attempts" not in kwargs and "payload" not in kwargs and "key" not in kwargs and "tenant" not in kwargs:
        with pytest.raises(error, match=message):
            Task.objects.claim_next(**kwargs)
    if "payload" in kwargs or "max_attempts" in kwargs:
        with pytest.raises(error, match=message):
            Task.objects.ensure("job", **kwargs)
    assert rows() == before


def test_limits_out_of_range() -> None:
    with pytest.raises(InvalidArgument, match="limit"):
        Task.objects.claim_next(limit=10**23)
    with pytest.raises(InvalidArgument, match="limit"):
        Task.objects.reclaim_expired(limit=2**63)


@pytest.mark.parametrize(
    ("error", "stored"),
    [
        ("nul\x00inside", "nulinside"),
        ("lone \ud800 surrogate", "lone \\ud800 surrogate"),
        (ValueError("bad \x00 \udcff"), "ValueError: bad  \\udcff"),
        ("e" * 20_000, "e" * 10_000),
    ],
)
def test_fail_stores_any_error_text(error: object, stored: str) -> None:
    claim = Task.objects.claim("job").claim
    assert claim.fail(error) == "failed"  # type: ignore[arg-type]
    assert Task.objects.get(key="job").error == stored


def test_fail_survives_an_exception_that_cannot_print() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    claim = Task.objects.claim("job").claim
    claim.fail(Unprintable(), retry=True)
    assert Task.objects.get(key="job").error == "Unprintable: <unprintable error>"


# -- payloads and keys -----------------------------------------------------------------------------


def test_payload_with_decimal_datetime_uuid_has_a_stable_fingerprint() -> None:
    payload = {"amount": decimal.Decimal("1.50"), "at": dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
               "id": uuid.UUID(int=5)}
    first = Task.objects.claim("job", payload=payload)
    again = Task.objects.claim("job", payload=dict(reversed(list(payload.items()))))
    assert first.claimed and not again.claimed  # a duplicate, not a mismatch
    task = Task.objects.get(key="job")
    assert task.payload == {"amount": "1.50", "at": "2026-01-02T00:00:00Z", "id": str(uuid.UUID(int=5))}
    with pytest.raises(PayloadMismatch):
        Task.objects.claim("job", payload={**payload, "amount": decimal.Decimal("1.5")})
    # Ensured later with the payload: stored in the same encoded form.
    Task.objects.ensure("later")
    Task.objects.ensure("later", payload=payload)
    assert Task.objects.get(key="later").payload == task.payload
    assert Task.objects.get(key="later").payload_fingerprint == task.payload_fingerprint


def test_taskkey_accepts_uuid_parts() -> None:
    ident = uuid.UUID("0b7c5f4e-9d8a-4c1e-8f00-1234567890ab")
    key = TaskKey("ship", run=ident, scope=(ident, 7), version=ident)
    assert key.key == f"{ident}:{ident}:7:ship@{ident}"
    assert key == TaskKey("ship", run=str(ident), scope=(str(ident), 7), version=str(ident)) or key.key == TaskKey(
        "ship", run=str(ident), scope=(str(ident), 7), version=str(ident)).key
    assert Task.objects.claim(key).claimed
    assert Task.objects.get().key == key.key


def test_bad_input_leaves_a_stored_task_alone() -> None:
    claim = Task.objects.claim("job", owner="w1", payload={"a": 1}).claim
    before = rows()
    for kwargs in ({"owner": "x" * 300}, {"lease": 1e9}, {"payload": "\ud800"}, {"max_attempts": 2**40}):
        with pytest.raises(TaskClaimError):
            Task.objects.claim("job", **kwargs)  # type: ignore[arg-type]
    assert rows() == before
    claim.complete("ok")
    assert User.objects.count() == 0  # (nothing else touched either)
