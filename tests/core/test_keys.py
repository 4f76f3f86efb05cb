"""Task identity: TaskKey, key/tenant validation, leases and payload fingerprints."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest

from django_taskclaim import TaskKey
from django_taskclaim.exceptions import InvalidLease, InvalidPayload, InvalidTaskKey
from django_taskclaim.identity import validate_key, validate_tenant
from django_taskclaim.values import fingerprint, lease_seconds


def test_taskkey_builds_the_documented_layout() -> None:
    key = TaskKey("test-generation", run="run-42", scope=("payments",))
    assert key.key == "run-42:payments:test-generation"
    assert str(key) == key.key
    assert TaskKey("op", run=7, scope=("a", 1), version="v2").key == "7:a:1:op@v2"
    assert TaskKey("op").key == ":op"


def test_taskkey_parts_never_collide() -> None:
    tricky = ["a", "b", "a:b", "a@b", "a%3Ab", "%", ":", "@", "b:"]
    seen: dict[str, tuple[object, ...]] = {}
    for run, op in itertools.product([None, *tricky], tricky):
        for scope in [(), ("a",), ("a", "b"), ("a:b",)]:
            for version in [None, "1", "1@2"]:
                parts = (run, scope, op, version)
                key = TaskKey(op, run=run, scope=scope, version=version).key
                assert key not in seen, f"{parts} and {seen[key]} both build {key!r}"
                seen[key] = parts
    # run given vs scope given, the classic ambiguity of naive joining:
    assert TaskKey("b", run="a").key != TaskKey("b", scope=("a",)).key


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"operation": ""}, "operation must not be empty"),
        ({"operation": "op", "run": ""}, "run must not be empty"),
        ({"operation": "op", "scope": "payments"}, "tuple of parts"),
        ({"operation": "op", "scope": (1.5,)}, "must be a string, an integer or a UUID"),
        ({"operation": "op", "run": True}, "must be a string, an integer or a UUID"),
        ({"operation": "x" * 300}, "255"),
        ({"operation": "op\n"}, "non-printable"),
        ({"operation": "op", "tenant": 3}, "tenant must be a string"),
    ],
)
def test_taskkey_rejects_bad_parts(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidTaskKey, match=message):
        TaskKey(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "must not be empty"),
        ("x" * 256, "256 characters long; the limit is 255"),
        ("a\x00b", r"non-printable character '\\x00' at position 1"),
        ("tab\there", "non-printable"),
        (42, "must be a string, not int"),
        (None, "must be a string, not NoneType"),
        (b"bytes", "must be a string, not bytes"),
    ],
)
def test_invalid_keys_are_named(key: object, message: str) -> None:
    with pytest.raises(InvalidTaskKey, match=message):
        validate_key(key)


def test_valid_keys_and_tenants() -> None:
    assert validate_key("x" * 255) == "x" * 255
    assert validate_key("run-42:payments:test-generation") == "run-42:payments:test-generation"
    assert validate_key("ünïcødé ✓") == "ünïcødé ✓"
    assert validate_tenant("") == ""
    with pytest.raises(InvalidTaskKey, match="tenant must be a string"):
        validate_tenant(None)
    with pytest.raises(InvalidTaskKey, match="non-printable"):
        validate_tenant("acme\r")


@pytest.mark.parametrize("lease", [0, -1, 0.0, float("nan"), float("inf"), timedelta(0), timedelta(seconds=-5)])
def test_non_positive_leases_are_refused(lease: object) -> None:
    with pytest.raises(InvalidLease, match="positive"):
        lease_seconds(lease)  # type: ignore[arg-type]


@pytest.mark.parametrize("lease", ["30", True, [30]])
def test_lease_of_wrong_type_is_refused(lease: object) -> None:
    with pytest.raises(InvalidLease, match="seconds or a timedelta"):
        lease_seconds(lease)  # type: ignore[arg-type]


def test_lease_forms(settings) -> None:  # type: ignore[no-untyped-def]
    assert lease_seconds(1) == 1.0
    assert lease_seconds(timedelta(minutes=2)) == 120.0
    settings.TASKCLAIM_DEFAULT_LEASE = 12
    assert lease_seconds(None) == 12.0


def test_fingerprint_is_canonical() -> None:
    assert fingerprint(None) == ""
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})
    assert len(fingerprint("x")) == 64
    with pytest.raises(InvalidPayload, match="payload is not JSON-serialisable"):
        fingerprint({"when": object()})
    with pytest.raises(InvalidPayload, match="not JSON-serialisable"):
        fingerprint(float("nan"))
