"""The outbox of a claim: messages recorded inside ``fenced()``, in the same transaction as the
completion, so a message exists only if the claim still owned the task when it committed.
``manage.py taskclaim_relay`` delivers them afterwards (:mod:`django_taskclaim.relay`)."""

from __future__ import annotations

import json
from typing import Any, Protocol
from urllib.parse import urlsplit

from django.apps import apps

from ..exceptions import InvalidArgument, TaskClaimError
from ..idempotency import idempotency_key
from ..values import to_json, validate_text


class Claim(Protocol):
    """What the outbox needs of the claim that records a message (:class:`~.claim.Claim`): named
    here, not imported, so that the claim, which offers ``claim.outbox``, is the only arrow."""

    key: str
    tenant: str
    token: int
    using: str
    _fences: int

#: The HTTP methods a message may use (no CONNECT/TRACE/OPTIONS/HEAD: none of them is an effect).
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
MAX_URL_LENGTH = 2048
MAX_EFFECT_LENGTH = 255
#: Bytes of JSON a message's body may hold: the outbox is for requests, not for bulk transfer.
MAX_BODY_BYTES = 1_048_576


def validate_url(url: Any) -> str:
    """An absolute ``http(s)`` URL with a host, at most 2048 characters, no spaces or controls."""
    validate_text(url, "url", MAX_URL_LENGTH)
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise InvalidArgument(f"url {url[:100]!r} contains whitespace or a control character")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        raise InvalidArgument(f"url {url[:100]!r} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument(f"url must be an absolute http:// or https:// URL with a host, not {url[:100]!r}")
    return url


class Outbox:
    """``claim.outbox``: records messages in the claim's open ``fenced()`` block."""

    def __init__(self, claim: Claim) -> None:
        self.claim = claim

    def http(self, method: str, url: str, *, json: Any = None, effect: str = "") -> int:
        """Record an HTTP request to send after commit; returns the message's id.

        ``json`` (a JSON-serialisable value, at most 1 MiB; ``None`` sends no body) is the request
        body; ``effect`` names the effect when the task makes several calls (each its own
        idempotency key). Only inside ``claim.fenced()``, whose token check has passed: the
        message commits with the block, or not at all.
        """
        claim = self.claim
        if not claim._fences:
            raise TaskClaimError(
                "claim.outbox.http() records a message only inside claim.fenced(), in the same "
                f"transaction as the completion (task {claim.key!r}, token {claim.token})")
        if not isinstance(method, str) or method.upper() not in METHODS:
            raise InvalidArgument(f"method must be one of {', '.join(METHODS)}, not {method!r}")
        validate_url(url)
        validate_text(effect, "effect", MAX_EFFECT_LENGTH)
        body = None if json is None else to_json(
            json, "the message's json body", InvalidArgument, limit=MAX_BODY_BYTES,
            limit_setting="the outbox", hint=" bytes")
        message_model = apps.get_model("django_taskclaim", "OutboxMessage")
        message = message_model.objects.using(claim.using).create(
            tenant=claim.tenant, task_key=claim.key, token=claim.token, effect=effect,
            idempotency_key=idempotency_key(claim.tenant, claim.key, effect), method=method.upper(),
            url=url, body=None if body is None else _loads(body),
        )
        return int(message.pk)


def _loads(text: str) -> Any:
    # The body stored is what the encoder wrote (a Decimal as its string), as results are.
    return json.loads(text)
