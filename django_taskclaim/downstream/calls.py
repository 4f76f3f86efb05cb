"""The headers of a fenced call, read and checked: garbage is a clear 400 naming the header."""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import NamedTuple

from django.http import HttpRequest

from ..conf import settings
from ..idempotency import FENCING_KEY, FENCING_TOKEN, IDEMPOTENCY_KEY, SIGNATURE, signature
from .models import MAX_KEY_LENGTH, MAX_METHOD_LENGTH

# Visible ASCII only: a key is compared byte for byte and stored in a unique column.
_KEY = re.compile(rf"[\x21-\x7e]{{1,{MAX_KEY_LENGTH}}}")
_TOKEN = re.compile(r"[0-9]{1,19}")
MAX_TOKEN = 2**63 - 1  # a BigIntegerField


class BadCall(ValueError):
    """A request the endpoint cannot record (a 400); its message names what is wrong."""


class BadHeader(BadCall):
    """A header missing or unusable; its message names the header."""


class BadSignature(ValueError):
    """A call without the ``Taskclaim-Signature`` the endpoint's keys require, or with a wrong one (a 401)."""


class Call(NamedTuple):
    """One fenced call as its headers describe it."""

    idempotency_key: str
    fencing_key: str  # "" when the call carries no fencing headers (require_fencing=False)
    token: int | None
    fingerprint: str


def _key(request: HttpRequest, name: str) -> str:
    value = request.headers.get(name)
    if value is None:
        raise BadHeader(f"the {name} header is missing")
    if not _KEY.fullmatch(value):
        raise BadHeader(f"the {name} header must be 1 to {MAX_KEY_LENGTH} visible ASCII characters")
    return value


def _token(request: HttpRequest) -> int:
    value = request.headers.get(FENCING_TOKEN)
    if value is None:
        raise BadHeader(f"the {FENCING_TOKEN} header is missing")
    if not _TOKEN.fullmatch(value) or not 1 <= int(value) <= MAX_TOKEN:
        raise BadHeader(f"the {FENCING_TOKEN} header must be a decimal integer from 1 to {MAX_TOKEN}")
    return int(value)


def fingerprint(request: HttpRequest) -> str:
    """SHA-256 of the method, the path with its query string, and the body's SHA-256."""
    body = hashlib.sha256(request.body).hexdigest()
    text = "\n".join([request.method or "", request.get_full_path(), body])
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def read_call(request: HttpRequest, *, require_fencing: bool) -> Call:
    """The call's keys and token; ``BadHeader`` for a missing or malformed one.

    Without ``require_fencing`` a call may leave both fencing headers out, but not one of them.
    """
    method = request.method or ""
    if len(method) > MAX_METHOD_LENGTH:  # the stored response's column holds no more
        raise BadCall(f"the method is {len(method)} characters long; the limit is {MAX_METHOD_LENGTH}")
    key = _key(request, IDEMPOTENCY_KEY)
    fenced = require_fencing or FENCING_KEY in request.headers or FENCING_TOKEN in request.headers
    if not fenced:
        return Call(key, "", None, fingerprint(request))
    return Call(key, _key(request, FENCING_KEY), _token(request), fingerprint(request))


def check_signature(request: HttpRequest, call: Call) -> None:
    """With ``TASKCLAIM_SIGNING_KEY`` set, ``BadSignature`` unless the call's ``Taskclaim-Signature``
    is the HMAC of its fencing key, token and idempotency key under one of the keys (several while
    keys rotate). Without the setting every call passes, signed or not (check W402 warns)."""
    keys = settings.SIGNING_KEY
    if not keys:
        return
    given = request.headers.get(SIGNATURE)
    if given is None:
        raise BadSignature(f"the {SIGNATURE} header is missing: this endpoint accepts signed calls only")
    token = "" if call.token is None else str(call.token)
    # Every key is tried (no early exit), each compared in constant time.
    matched = [hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                                   signature(key, call.fencing_key, token, call.idempotency_key).encode())
               for key in keys]
    if not any(matched):
        raise BadSignature(f"the {SIGNATURE} header does not match the call's keys and token under any "
                           "TASKCLAIM_SIGNING_KEY of this service")
