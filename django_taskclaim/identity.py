"""Who a task is and who holds it: the ``TaskKey`` builder and the checks of a key, a tenant
and an owner (or a delivery id).

Everything is checked before the first statement, so a bad identity raises
:class:`~django_taskclaim.exceptions.InvalidTaskKey` (an owner: ``InvalidArgument``) and writes nothing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from .exceptions import InvalidTaskKey
from .values import validate_text

MAX_KEY_LENGTH = 255
MAX_TENANT_LENGTH = 255
#: Length of the ``owner`` and ``delivery_id`` columns.
MAX_OWNER_LENGTH = 255

# Characters with a meaning in the canonical form; each is percent-escaped inside a part.
_ESCAPES = {"%": "%25", ":": "%3A", "@": "%40"}


def _escape(part: object, what: str) -> str:
    if isinstance(part, bool) or not isinstance(part, str | int | uuid.UUID):
        raise InvalidTaskKey(f"TaskKey {what} must be a string, an integer or a UUID, not {type(part).__name__}")
    text = str(part)  # a UUID in its canonical hyphenated lower-case form
    if not text:
        raise InvalidTaskKey(f"TaskKey {what} must not be empty")
    return "".join(_ESCAPES.get(ch, ch) for ch in text)


@dataclass(frozen=True)
class TaskKey:
    """Build a canonical task key from the parts that make one unit of logical work.

    ``TaskKey("test-generation", run="run-42", scope=("payments",))`` gives the key
    ``run-42:payments:test-generation``. Parts are strings, integers or ``uuid.UUID`` (written
    in the canonical hyphenated form, so a UUID and its string build the same key). The layout
    is always ``run:scope…:operation`` with an optional ``@version``; separators inside a part
    are escaped, so two different sets of parts never build the same key.

    A key names the *work*, not a delivery: never build it from a message id, a worker name
    or an attempt number. Prompt text or an endpoint name alone is not an identity either —
    two runs asking for "tests for POST /payments" are two tasks; give each its run (and the
    version of the inputs) so that a redelivery of the same request maps to the same key.
    """

    operation: str | int | uuid.UUID
    run: str | int | uuid.UUID | None = None
    scope: tuple[str | int | uuid.UUID, ...] = ()
    version: str | int | uuid.UUID | None = None
    tenant: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.scope, str):
            raise InvalidTaskKey("TaskKey scope must be a tuple of parts, not a single string")
        object.__setattr__(self, "scope", tuple(self.scope))
        validate_tenant(self.tenant)
        validate_key(self.key)

    @property
    def key(self) -> str:
        """The canonical key string."""
        run = "" if self.run is None else _escape(self.run, "run")
        parts = [run, *(_escape(p, "scope part") for p in self.scope), _escape(self.operation, "operation")]
        key = ":".join(parts)
        if self.version is not None:
            key += "@" + _escape(self.version, "version")
        return key

    def __str__(self) -> str:
        return self.key


def validate_key(key: object) -> str:
    """Return ``key`` if it is a usable task key, else raise :class:`InvalidTaskKey`."""
    if not isinstance(key, str):
        raise InvalidTaskKey(f"task key must be a string, not {type(key).__name__}")
    if not key:
        raise InvalidTaskKey("task key must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidTaskKey(f"task key is {len(key)} characters long; the limit is {MAX_KEY_LENGTH}")
    if not key.isprintable():
        bad = next(ch for ch in key if not ch.isprintable())
        raise InvalidTaskKey(
            f"task key contains the non-printable character {bad!r} at position {key.index(bad)}"
        )
    return key


def validate_tenant(tenant: object) -> str:
    """Return ``tenant`` if usable (``""`` included), else raise :class:`InvalidTaskKey`."""
    if not isinstance(tenant, str):
        raise InvalidTaskKey(f"tenant must be a string, not {type(tenant).__name__}")
    if len(tenant) > MAX_TENANT_LENGTH:
        raise InvalidTaskKey(f"tenant is {len(tenant)} characters long; the limit is {MAX_TENANT_LENGTH}")
    if not tenant.isprintable():
        raise InvalidTaskKey("tenant contains a non-printable character")
    return tenant


def resolve_identity(key: str | TaskKey, tenant: str) -> tuple[str, str]:
    """Turn the ``key``/``tenant`` arguments of the manager into a validated pair."""
    if isinstance(key, TaskKey):
        if tenant and tenant != key.tenant:
            raise InvalidTaskKey(
                f"tenant {tenant!r} contradicts the TaskKey's tenant {key.tenant!r}"
            )
        return key.key, key.tenant
    return validate_key(key), validate_tenant(tenant)


def validate_owner(owner: object, what: str = "owner") -> str:
    """Return ``owner`` (or a delivery id, ``what``) if the ``owner`` column can store it, else
    raise :class:`InvalidArgument` naming the problem."""
    return validate_text(owner, what, MAX_OWNER_LENGTH)
