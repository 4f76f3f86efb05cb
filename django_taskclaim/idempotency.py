"""The header contract of an effect beyond the database (issue 34), shared by both sides.

A caller's claim sends these headers (:meth:`Claim.headers`); a downstream service built on
:mod:`django_taskclaim.downstream` reads them. The names and the key's formula are fixed: a
service may check them without this package.
"""

from __future__ import annotations

import hashlib
import json

from .values import validate_text

IDEMPOTENCY_KEY = "Idempotency-Key"
FENCING_KEY = "Taskclaim-Fencing-Key"
FENCING_TOKEN = "Taskclaim-Fencing-Token"  # noqa: S105 (a header name)
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
    return {
        IDEMPOTENCY_KEY: idempotency_key(tenant, key, effect),
        FENCING_KEY: idempotency_key(tenant, key),
        FENCING_TOKEN: str(token),
    }
