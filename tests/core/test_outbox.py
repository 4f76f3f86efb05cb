"""The outbox: ``claim.outbox.http(...)`` inside ``fenced()`` records a message in the same
transaction as the completion, so it exists only if the claim still owned the task. The relay's
claim of a message and the record of its answer are fenced by the relay's own token."""

from __future__ import annotations

import hashlib
import json

import pytest

from django_taskclaim.exceptions import InvalidArgument, StaleClaim, TaskClaimError
from django_taskclaim.idempotency import fencing_headers
from django_taskclaim.models import OutboxMessage, Task
from django_taskclaim.relay import claim_messages, record_answer
from tests.conftest import expire

pytestmark = pytest.mark.django_db(transaction=True)


def contract_key(tenant: str, key: str, effect: str) -> str:
    text = json.dumps([tenant, key, effect], ensure_ascii=False, separators=(",", ":"))
    return "tc1-" + hashlib.sha256(text.encode()).hexdigest()


def test_headers_follow_the_contract() -> None:
    headers = fencing_headers("acme", "invoice:7", 3, "charge")
    assert headers == {
        "Idempotency-Key": contract_key("acme", "invoice:7", "charge"),
        "Taskclaim-Fencing-Key": contract_key("acme", "invoice:7", ""),
        "Taskclaim-Fencing-Token": "3",
    }
    assert len(headers["Idempotency-Key"]) == 68 and headers["Idempotency-Key"].isascii()
    # Non-ASCII keys hash their UTF-8 text (ensure_ascii=False), as the contract says.
    assert fencing_headers("", "clé", 1, "")["Idempotency-Key"] == contract_key("", "clé", "")


def test_a_message_recorded_with_the_completion() -> None:
    claim = Task.objects.claim("order:1", tenant="acme", lease=30).claim
    assert claim is not None
    with claim.fenced():
        message_id = claim.outbox.http("POST", "http://127.0.0.1:9/charge", json={"cents": 100}, effect="charge")
        claim.complete({"ok": True})
    message = OutboxMessage.objects.get(pk=message_id)
    assert (message.tenant, message.task_key, message.token, message.effect) == (
        "acme", "order:1", claim.token, "charge")
    assert message.status == OutboxMessage.Status.PENDING
    assert message.idempotency_key == contract_key("acme", "order:1", "charge")
    assert (message.method, message.url, message.body) == ("POST", "http://127.0.0.1:9/charge", {"cents": 100})
    assert message.attempts == 0 and message.relay_token == 0


def test_a_rolled_back_block_leaves_no_message() -> None:
    claim = Task.objects.claim("order:2", lease=30).claim
    assert claim is not None
    with pytest.raises(RuntimeError), claim.fenced():
        claim.outbox.http("POST", "http://127.0.0.1:9/x")
        raise RuntimeError("the body failed after recording")
    assert not OutboxMessage.objects.exists()


def test_a_fenced_off_claim_records_nothing() -> None:
    claim = Task.objects.claim("order:3", lease=30).claim
    assert claim is not None
    expire(claim)
    assert Task.objects.claim("order:3", owner="thief", lease=30).claimed
    with pytest.raises(StaleClaim), claim.fenced():
        claim.outbox.http("POST", "http://127.0.0.1:9/x")  # never reached: the block is refused
        claim.complete("late")
    assert not OutboxMessage.objects.exists()


def test_outside_fenced_is_refused() -> None:
    claim = Task.objects.claim("order:4", lease=30).claim
    assert claim is not None
    with pytest.raises(TaskClaimError, match=r"inside claim\.fenced\(\)"):
        claim.outbox.http("POST", "http://127.0.0.1:9/x")
    assert not OutboxMessage.objects.exists()


@pytest.mark.parametrize(("args", "kwargs", "problem"), [
    (("FETCH", "http://h/x"), {}, "method"),
    (("POST", "ftp://h/x"), {}, "url"),
    (("POST", "http:///nohost"), {}, "url"),
    (("POST", "http://h/x"), {"json": {1, 2}}, "JSON"),
    (("POST", "http://h/x"), {"json": "x" * 1_100_000}, "bytes"),
    (("POST", "http://h/x"), {"effect": "e" * 300}, "effect"),
    (("POST", "http://h/" + "p" * 3000), {}, "url"),
    (("POST", "http://host/caf\u00e9"), {}, "non-ASCII character 'é' at position 15: percent-encode"),
    (("POST", "http://b\u00fccher.example/x"), {}, "IDNA"),
    (("POST", "http://h/x"), {"headers": ["Authorization"]}, "mapping"),
    (("POST", "http://h/x"), {"headers": {"Bad Name": "v"}}, "not a token"),
    (("POST", "http://h/x"), {"headers": {"X-Evil": "a\r\nX-Injected: 1"}}, "'X-Evil' has a value with a control"),
    (("POST", "http://h/x"), {"headers": {"X-Caf\u00e9": "v"}}, "not a token"),
    (("POST", "http://h/x"), {"headers": {"X-Name": "caf\u00e9"}}, "non-ASCII"),
    (("POST", "http://h/x"), {"headers": {"X-Name": 1}}, "str value"),
    (("POST", "http://h/x"), {"headers": {"X-Name": "v" * 9000}}, "limit is 8192"),
    (("POST", "http://h/x"), {"headers": {"idempotency-key": "mine"}}, "the relay's own"),
    (("POST", "http://h/x"), {"headers": {"Taskclaim-Fencing-Token": "9"}}, "the relay's own"),
    (("POST", "http://h/x"), {"headers": {"Host": "other"}}, "the relay's own"),
    (("POST", "http://h/x"), {"headers": {"X-A": "1", "x-a": "2"}}, "twice"),
    (("POST", "http://h/x"), {"headers": {f"X-{n}": "v" for n in range(51)}}, "limit is 50"),
])
def test_bad_input_is_named(args: tuple[str, str], kwargs: dict[str, object], problem: str) -> None:
    claim = Task.objects.claim("order:5", lease=30).claim
    assert claim is not None
    with pytest.raises(InvalidArgument, match=problem), claim.fenced():
        claim.outbox.http(*args, **kwargs)  # type: ignore[arg-type]
    assert not OutboxMessage.objects.exists()


@pytest.mark.parametrize("url", ["http://alice:pw-s3cr3t@host/x", "https://alice@host/x", "http://:pw-s3cr3t@host/x",
                                 "http://alice:pw-s3cr3t@host/x y"])
def test_credentials_in_the_url_are_refused_without_showing_them(url: str) -> None:
    claim = Task.objects.claim("order:6", lease=30).claim
    assert claim is not None
    with pytest.raises(InvalidArgument) as raised, claim.fenced():
        claim.outbox.http("POST", url)
    message = str(raised.value)
    assert "s3cr3t" not in message and "***@host" in message
    assert "user name or password" in message or "whitespace" in message
    assert not OutboxMessage.objects.exists()


def test_a_messages_own_headers_are_stored_with_it() -> None:
    claim = Task.objects.claim("order:7", lease=30).claim
    assert claim is not None
    with claim.fenced():
        message_id = claim.outbox.http("POST", "https://h/x", headers={"Authorization": "Bearer t", "X-Trace": "1"})
        claim.complete(None)
    assert OutboxMessage.objects.get(pk=message_id).headers == {"Authorization": "Bearer t", "X-Trace": "1"}


def test_one_bound_for_an_effect_name_on_both_sides() -> None:
    """The outbox stores an effect the idempotency key can be made of: one constant, 200."""
    from django_taskclaim import idempotency
    from django_taskclaim.lifecycle import outbox

    assert outbox.MAX_EFFECT_LENGTH is idempotency.MAX_EFFECT_LENGTH == 200


def recorded(key: str, effect: str = "") -> OutboxMessage:
    claim = Task.objects.claim(key, lease=30).claim
    assert claim is not None
    with claim.fenced():
        message_id = claim.outbox.http("POST", "http://127.0.0.1:9/x", effect=effect)
        claim.complete(None)
    return OutboxMessage.objects.get(pk=message_id)


def test_a_relay_claims_a_message_once_and_a_stale_relay_cannot_record() -> None:
    message = recorded("order:6")
    [first] = claim_messages(Task.objects.db, owner="relay-a", lease=30, batch=10)
    assert first.id == message.id and first.relay_token == 1
    assert claim_messages(Task.objects.db, owner="relay-b", lease=30, batch=10) == []  # leased to relay-a
    OutboxMessage.objects.filter(pk=message.pk).update(lease_expires_at=None)  # relay-a's lease ran out
    [second] = claim_messages(Task.objects.db, owner="relay-b", lease=30, batch=10)
    assert second.relay_token == 2
    # relay-a comes back with its answer: refused, relay-b's claim stands.
    assert not record_answer(Task.objects.db, first, delivered=True, final=True, status_code=200, excerpt="late")
    assert record_answer(Task.objects.db, second, delivered=True, final=True, status_code=201, excerpt="ok")
    message.refresh_from_db()
    assert (message.status, message.answer_status, message.answer_excerpt) == ("delivered", 201, "ok")
    assert claim_messages(Task.objects.db, owner="relay-c", lease=30, batch=10) == []


def test_recorded_inside_afenced_too() -> None:
    """The awaitable twin: ``afenced(func)`` runs ``func`` inside ``fenced()`` on the ORM thread."""
    import asyncio

    from asgiref.sync import sync_to_async
    from django.db import connections

    def publish(claim: object) -> int:
        message_id = claim.outbox.http("POST", "http://127.0.0.1:9/a", json=[1])  # type: ignore[attr-defined]
        claim.complete("done")  # type: ignore[attr-defined]
        return int(message_id)

    async def main() -> int:
        try:
            claim = (await sync_to_async(Task.objects.claim)("order:7", lease=30)).claim
            assert claim is not None
            return await claim.afenced(publish, claim)
        finally:
            await sync_to_async(connections.close_all)()  # the ORM thread's session

    message_id = asyncio.run(main())
    assert OutboxMessage.objects.get(pk=message_id).body == [1]
    assert Task.objects.get(key="order:7").status == "succeeded"
