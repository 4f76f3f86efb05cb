"""The caller's side of issue 34: a claim's idempotency key and the headers of an HTTP call."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from hypothesis import given, settings
from hypothesis import strategies as st

from django_taskclaim import arun_once, run_once
from django_taskclaim.exceptions import InvalidArgument
from django_taskclaim.execution import current_claim
from django_taskclaim.models import Task

pytestmark = pytest.mark.django_db


def expected_key(tenant: str, key: str, effect: str) -> str:
    """The contract, written out independently of the code under test."""
    text = json.dumps([tenant, key, effect], ensure_ascii=False, separators=(",", ":"))
    return "tc1-" + hashlib.sha256(text.encode()).hexdigest()


def test_the_key_and_headers_follow_the_contract() -> None:
    claim = Task.objects.claim("order-7", tenant="acme", owner="w1").claim
    assert claim.idempotency_key() == expected_key("acme", "order-7", "")
    assert claim.idempotency_key("charge") == expected_key("acme", "order-7", "charge")
    assert len(claim.idempotency_key()) == 68 and claim.idempotency_key().isascii()
    assert claim.headers("charge") == {
        "Idempotency-Key": expected_key("acme", "order-7", "charge"),
        "Taskclaim-Fencing-Key": expected_key("acme", "order-7", ""),
        "Taskclaim-Fencing-Token": "1",
    }


def test_the_key_is_stable_across_attempts_and_owners_while_the_token_rises() -> None:
    first = Task.objects.claim("k", owner="w1").claim
    first.release()
    second = Task.objects.claim("k", owner="w2").claim
    assert second.token > first.token
    assert first.idempotency_key("e") == second.idempotency_key("e")
    assert first.headers()["Taskclaim-Fencing-Token"] == str(first.token)
    assert second.headers()["Taskclaim-Fencing-Token"] == str(second.token)
    # Tenants and effects keep keys apart, with no way to forge one from the other's text.
    assert Task.objects.claim("k", tenant="t", owner="w").claim.idempotency_key() != first.idempotency_key()
    assert expected_key("a", "b,c", "") != expected_key("a,b", "c", "")


@pytest.mark.django_db(transaction=True)  # arun_once's ORM work runs on another thread
def test_every_running_claim_has_them_sync_and_async() -> None:
    seen = run_once("body-key", lambda: current_claim().headers("mail"))
    assert seen["Idempotency-Key"] == expected_key("", "body-key", "mail")

    async def body() -> str:
        return current_claim().idempotency_key()

    async def main() -> str:
        try:
            return await arun_once("async-key", body)
        finally:  # the ORM thread's connection, so that the test database can be flushed
            await sync_to_async(connections.close_all)()

    assert asyncio.run(main()) == expected_key("", "async-key", "")


@pytest.mark.parametrize(
    ("effect", "message"),
    [(None, "effect must be a string"), (b"x", "effect must be a string"), ("x" * 201, "limit is 200"),
     ("a\x00b", "NUL"), ("\ud800", "effect")],
)
def test_a_bad_effect_is_refused_by_name(effect: object, message: str) -> None:
    claim = Task.objects.claim("bad-effect", owner="w").claim
    for call in (claim.idempotency_key, claim.headers):
        with pytest.raises(InvalidArgument, match=message):
            call(effect)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(tenant=st.text(max_size=20), key=st.text(min_size=1, max_size=20),
       effect=st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30))
def test_the_key_is_ascii_68_characters_for_any_text(tenant: str, key: str, effect: str) -> None:
    from django_taskclaim.idempotency import idempotency_key

    assert idempotency_key(tenant, key, effect) == expected_key(tenant, key, effect)


def test_with_a_signing_key_the_headers_are_signed_by_its_first_key(settings) -> None:  # type: ignore[no-untyped-def]
    """``Taskclaim-Signature``: ``sha256=`` and the HMAC-SHA256 of the fencing key, the token and the
    idempotency key joined by newlines, written out here apart from the code under test."""
    import hmac

    claim = Task.objects.claim("order-8", tenant="acme", owner="w1").claim
    assert "Taskclaim-Signature" not in claim.headers("charge")  # unset: unsigned, as before
    settings.TASKCLAIM_SIGNING_KEY = ["current-key", "previous-key"]
    headers = claim.headers("charge")
    text = "\n".join([expected_key("acme", "order-8", ""), str(claim.token), expected_key("acme", "order-8", "charge")])
    assert headers["Taskclaim-Signature"] == "sha256=" + hmac.new(b"current-key", text.encode(), "sha256").hexdigest()
    assert set(headers) == {
        "Idempotency-Key", "Taskclaim-Fencing-Key", "Taskclaim-Fencing-Token", "Taskclaim-Signature"}
