"""The header contract of an effect beyond the database (issue 34), shared by both sides, and the
signature of a call (``TASKCLAIM_SIGNING_KEY``).

A caller's claim sends these headers (:meth:`Claim.headers`); a downstream service built on
:mod:`django_taskclaim.downstream` reads them. The names and the key's formula are fixed: a
service may check them without this package.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from .conf import settings
from .values import validate_text

IDEMPOTENCY_KEY = "Idempotency-Key"
FENCING_KEY = "Taskclaim-Fencing-Key"
FENCING_TOKEN = "Taskclaim-Fencing-Token"  # noqa: S105 (a header name)
SIGNATURE = "Taskclaim-Signature"
#: A signature's value: the HMAC's name, then its hex digest.
SIGNATURE_PREFIX = "sha256="
#: The problem types (RFC 9457 ``type``) of a fenced endpoint's refusals: a client tells them apart
#: without reading their text. The two 409s differ so: ``in-flight`` (the same key still running:
#: retry after ``Retry-After``) and ``stale-token`` (a newer owner has called: never retry).
PROBLEM = "urn:taskclaim:problem:"
BAD_REQUEST = PROBLEM + "bad-request"
BAD_SIGNATURE = PROBLEM + "bad-signature"
IN_FLIGHT = PROBLEM + "in-flight"
STALE_TOKEN = PROBLEM + "stale-token"  # noqa: S105 (a problem type)
KEY_REUSED = PROBLEM + "key-reused"
#: The longest effect name: a label ("charge", "email:welcome"), not a payload.
MAX_EFFECT_LENGTH = 200
#: Every key starts with the contract's version, so a later formula cannot collide with this one.
KEY_PREFIX = "tc1-"


def idempotency_key(tenant: str, key: str, effect: str = "") -> str:
    """``tc1-`` and the SHA-256 of ``[tenant, key, effect]`` as compact JSON: 68 ASCII characters.

    The same for every attempt and worker of one task (no token, no owner), so a downstream
    recognises a retry; JSON keeps ``("a", "b,c")`` and ``("a,b", "c")`` apart.
    """
    validate_text(effect, "effect", MAX_EFFECT_LENGTH)
    text = json.dumps([tenant, key, effect], ensure_ascii=False, separators=(",", ":"))
    return KEY_PREFIX + hashlib.sha256(text.encode()).hexdigest()


def fencing_headers(tenant: str, key: str, token: int, effect: str = "") -> dict[str, str]:
    """The headers of one call: its idempotency key, and the task's fencing key and token.

    The fencing key leaves the effect out: tokens compare per task, whichever call carries them.
    """
    headers = {
        IDEMPOTENCY_KEY: idempotency_key(tenant, key, effect),
        FENCING_KEY: idempotency_key(tenant, key),
        FENCING_TOKEN: str(token),
    }
    keys = settings.SIGNING_KEY
    if keys:  # the first key signs; a downstream may accept several while keys rotate
        headers[SIGNATURE] = signature(keys[0], headers[FENCING_KEY], headers[FENCING_TOKEN], headers[IDEMPOTENCY_KEY])
    return headers


def signature(secret: bytes, fencing_key: str, token: str, idempotency_key: str) -> str:
    """``sha256=`` and the hex HMAC-SHA256, under ``secret``, of the fencing key, the token and the
    idempotency key joined by newlines (none can hold one): without the secret, no token can be
    forged for a task, nor a signed call's token moved to another key."""
    text = "\n".join((fencing_key, token, idempotency_key))
    return SIGNATURE_PREFIX + hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()
