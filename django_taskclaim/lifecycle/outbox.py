"""The outbox of a claim: messages recorded inside ``fenced()``, in the same transaction as the
completion, so a message exists only if the claim still owned the task when it committed.
``manage.py taskclaim_relay`` delivers them afterwards (:mod:`django_taskclaim.relay`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

from django.apps import apps

from ..exceptions import InvalidArgument, TaskClaimError
from ..idempotency import MAX_EFFECT_LENGTH, idempotency_key
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
#: Bytes of JSON a message's body may hold: the outbox is for requests, not for bulk transfer.
MAX_BODY_BYTES = 1_048_576
#: Headers a message may carry of its own (``headers=``), and the bounds of each.
MAX_HEADERS = 50
MAX_HEADER_NAME_LENGTH = 100
MAX_HEADER_VALUE_LENGTH = 8192
#: A header's name: an RFC 9110 token.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: Headers the relay writes itself (the contract's, the body's, the connection's): a message's own
#: headers may not replace them. Lower case; ``taskclaim-*`` are all reserved.
RESERVED_HEADERS = frozenset({
    "idempotency-key", "content-type", "content-length", "transfer-encoding", "host", "connection",
    "expect", "te", "upgrade", "trailer", "keep-alive", "proxy-connection"})
#: A user name and password at the start of an URL (``scheme://user:password@``).
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")


def shown_url(url: str) -> str:
    """``url`` as errors and logs may show it: any ``user:password@`` replaced by ``***@``, the query
    string and fragment left out (either may carry a secret), at most 100 characters."""
    text = _USERINFO.sub(r"\1***@", url)
    text = text.split("?", 1)[0].split("#", 1)[0]
    return text if len(text) <= 100 else text[:99] + "…"


def _control(text: str, *, space: bool) -> str | None:
    """The first control character of ``text`` (CR, LF, NUL…; any whitespace too unless ``space``): a
    URL or a header holding one could end the request line or a header and start another one."""
    for ch in text:
        if ord(ch) < 32 or ord(ch) == 127 or (not space and ch.isspace()):
            return ch
    return None


def validate_url(url: Any) -> str:
    """An absolute ``http(s)`` URL with a host, at most 2048 ASCII characters, no spaces or controls,
    no user name or password. Errors never show a password or the query string."""
    validate_text(url, "url", MAX_URL_LENGTH)
    shown = shown_url(url)
    if _control(url, space=False) is not None:
        raise InvalidArgument(f"url {shown!r} contains whitespace or a control character")
    if not url.isascii():
        # http.client sends the request line as ASCII: a relay could never send it.
        bad = next(ch for ch in url if not ch.isascii())
        raise InvalidArgument(
            f"url {shown!r} contains the non-ASCII character {bad!r} at position {url.index(bad)}: "
            "percent-encode the path and query (django.utils.encoding.iri_to_uri) and give the host "
            "in its IDNA form (xn--…)")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        raise InvalidArgument(f"url {shown!r} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument(f"url must be an absolute http:// or https:// URL with a host, not {shown!r}")
    if parts.username is not None or parts.password is not None:
        raise InvalidArgument(
            f"url {shown!r} carries a user name or password: it would be stored, logged and never sent "
            "as credentials; pass them in headers= (e.g. {'Authorization': 'Basic …'}) instead")
    return url


def validate_headers(headers: Any) -> dict[str, str]:
    """A message's own headers as stored: a mapping of RFC 9110 token names to printable ASCII values,
    none of the relay's own (:data:`RESERVED_HEADERS`, ``Taskclaim-*``), no name twice in any case.
    Errors name the header, never its value (it may be a secret)."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidArgument(f"headers must be a mapping of names to values, not {type(headers).__name__}")
    if len(headers) > MAX_HEADERS:
        raise InvalidArgument(f"headers holds {len(headers)} headers; the limit is {MAX_HEADERS}")
    found: dict[str, str] = {}
    seen: set[str] = set()
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name) or len(name) > MAX_HEADER_NAME_LENGTH:
            raise InvalidArgument(f"header name {str(name)[:MAX_HEADER_NAME_LENGTH]!r} is not a token of 1 to "
                                  f"{MAX_HEADER_NAME_LENGTH} letters, digits and !#$%&'*+-.^_`|~")
        folded = name.lower()
        if folded in RESERVED_HEADERS or folded.startswith("taskclaim-"):
            raise InvalidArgument(f"header {name!r} is the relay's own (the idempotency and fencing "
                                  "headers, the body's and the connection's): it cannot be replaced")
        if folded in seen:
            raise InvalidArgument(f"header {name!r} is given twice (names are case-insensitive)")
        seen.add(folded)
        if not isinstance(value, str):
            raise InvalidArgument(f"header {name!r} must have a str value, not {type(value).__name__}")
        if len(value) > MAX_HEADER_VALUE_LENGTH:
            raise InvalidArgument(f"header {name!r} has a value of {len(value)} characters; the limit is "
                                  f"{MAX_HEADER_VALUE_LENGTH}")
        if _control(value, space=True) is not None or not value.isascii():
            raise InvalidArgument(f"header {name!r} has a value with a control character (CR, LF, NUL…) or "
                                  "a non-ASCII character: only printable ASCII can be sent")
        found[name] = value
    return found


class Outbox:
    """``claim.outbox``: records messages in the claim's open ``fenced()`` block."""

    def __init__(self, claim: Claim) -> None:
        self.claim = claim

    def http(self, method: str, url: str, *, json: Any = None, effect: str = "",
             headers: Mapping[str, str] | None = None) -> int:
        """Record an HTTP request to send after commit; returns the message's id.

        ``json`` (a JSON-serialisable value, at most 1 MiB; ``None`` sends no body) is the request
        body; ``effect`` names the effect when the task makes several calls (each its own
        idempotency key); ``headers`` are sent too (authentication: stored with the message until
        it is delivered, never logged). Only inside ``claim.fenced()``, whose token check has passed:
        the message commits with the block, or not at all.
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
        own = validate_headers(headers)
        body = None if json is None else to_json(
            json, "the message's json body", InvalidArgument, limit=MAX_BODY_BYTES,
            limit_setting="the outbox", hint=" bytes")
        message_model = apps.get_model("django_taskclaim", "OutboxMessage")
        message = message_model.objects.using(claim.using).create(
            tenant=claim.tenant, task_key=claim.key, token=claim.token, effect=effect,
            idempotency_key=idempotency_key(claim.tenant, claim.key, effect), method=method.upper(),
            url=url, body=None if body is None else _loads(body), headers=own,
        )
        return int(message.pk)


def _loads(text: str) -> Any:
    # The body stored is what the encoder wrote (a Decimal as its string), as results are.
    return json.loads(text)
