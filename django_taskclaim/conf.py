"""Settings of django-taskclaim, read from ``django.conf.settings`` on first use.

Each property reads ``TASKCLAIM_<NAME>`` when first accessed, never at import, and keeps the
value: the claim path reads several settings per call, and Django's settings lookup is not
free. Django's ``setting_changed`` signal (sent by ``override_settings`` and pytest-django's
``settings`` fixture) forgets a changed value, so tests that change a setting see it at once.

===================================  =========  ============  ==============================================
Setting                              Type       Default       Meaning
===================================  =========  ============  ==============================================
``TASKCLAIM_DEFAULT_LEASE``          float      ``30.0``      Lease in seconds when a call passes none.
``TASKCLAIM_MAX_ATTEMPTS``           int        ``5``         Claims a task may get before it ends FAILED.
``TASKCLAIM_MAX_RESULT_BYTES``       int        ``1048576``   Largest JSON result ``complete()`` stores.
``TASKCLAIM_MAX_PAYLOAD_BYTES``      int        ``1048576``   Largest JSON payload a claim or ``ensure()``
                                                              stores (``InvalidPayload`` above it).
``TASKCLAIM_MAX_LEASE``              float      ``604800.0``  Longest lease (and heartbeat) in seconds, 7
                                                              days; at most ten years. Longer leases, and
                                                              leases under 0.1 s, raise ``InvalidLease``.
``TASKCLAIM_JSON_ENCODER``           str        Django's      Dotted path of the ``json.JSONEncoder``
                                                encoder       subclass for payloads and results (default
                                                              ``django.core.serializers.json.
                                                              DjangoJSONEncoder``: ``Decimal``, ``UUID``
                                                              -> str, ``datetime`` -> ISO 8601 str).
``TASKCLAIM_DATABASE``               str        default       Database alias of the task table; with a router,
                                                              the default task database (``Task.objects``).
                                                              Default: the first of ``TASKCLAIM_DATABASES``
                                                              when that is set, else ``"default"``.
``TASKCLAIM_DATABASES``              list       DATABASE      Every database alias holding task tables
                                                              (checks E007-E009).
``TASKCLAIM_ROUTER``                 str        ``None``      Dotted path of a callable ``router(tenant)``
                                                              that returns the alias (one of
                                                              ``TASKCLAIM_DATABASES``) holding the tenant's
                                                              tasks; ``None``: every task in one database.
``TASKCLAIM_DATABASE_TIMEOUT``       float      ``10.0``      Seconds ``claim_next()`` without a tenant waits
                                                              for one of several task databases before it
                                                              goes on without it (a hung server).
``TASKCLAIM_AUDIT``                  bool       ``True``      Record an ``Attempt`` row for every claim.
``TASKCLAIM_POLL_INTERVAL``          float      ``0.5``       Seconds between polls of ``on_busy="wait"``.
``TASKCLAIM_RETRY_BACKOFF``          dict       ``{}``        A failed queued task's wait before its retry:
                                                              ``Backoff`` fields ``base`` (1.0 s), ``factor``
                                                              (2.0), ``cap`` (300 s), ``jitter`` (0.5).
``TASKCLAIM_PREPARED_STATEMENTS``    bool       ``True``      PostgreSQL: run the claim, heartbeat and
                                                              completion statements as prepared statements
                                                              (planned once per server session). Set
                                                              ``False`` behind a pooler in transaction mode
                                                              (check E010).
``TASKCLAIM_SCHEDULES``              dict       ``{}``        Schedules that fire once per tick, by name
                                                              (docs/django-tasks.md, "Schedules"; checks
                                                              E301-E305).
``TASKCLAIM_SIGNING_KEY``           str or     ``None``      The secret that signs calls to a downstream
                                     list                     (``Taskclaim-Signature``); a list on the
                                                              downstream's side accepts each of its keys
                                                              (rotation), the first one signs (checks
                                                              E401, W402).
``TASKCLAIM_CELERY_APP``             str        ``None``      Dotted path of the Celery app the bridge's
                                                              checks inspect (default: the project's app, as
                                                              ``celery -A proj`` finds it;
                                                              read and validated by ``django_taskclaim.celery``).
===================================  =========  ============  ==============================================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS
from django.utils.module_loading import import_string

if TYPE_CHECKING:
    from .retries import Backoff

_MISSING = object()

#: Every ``TASKCLAIM_*`` setting the app reads (check W005 names any other, with the closest of these).
KNOWN_SETTINGS = frozenset({
    "TASKCLAIM_DEFAULT_LEASE", "TASKCLAIM_MAX_ATTEMPTS", "TASKCLAIM_MAX_RESULT_BYTES", "TASKCLAIM_MAX_PAYLOAD_BYTES",
    "TASKCLAIM_MAX_LEASE", "TASKCLAIM_JSON_ENCODER", "TASKCLAIM_DATABASE", "TASKCLAIM_DATABASES", "TASKCLAIM_ROUTER",
    "TASKCLAIM_DATABASE_TIMEOUT", "TASKCLAIM_AUDIT", "TASKCLAIM_POLL_INTERVAL", "TASKCLAIM_RETRY_BACKOFF",
    "TASKCLAIM_PREPARED_STATEMENTS", "TASKCLAIM_SCHEDULES", "TASKCLAIM_CELERY_APP", "TASKCLAIM_SIGNING_KEY",
})


class TaskClaimSettings:
    """Typed, lazy view of the ``TASKCLAIM_*`` settings, each read once until it changes."""

    def __init__(self) -> None:
        self._values: dict[str, object] = {}

    def _get(self, name: str, default: object) -> object:
        value = self._values.get(name, _MISSING)
        if value is _MISSING:
            value = self._values[name] = getattr(django_settings, f"TASKCLAIM_{name}", default)
        return value

    def forget(self, setting: str | None = None) -> None:
        """Read ``setting`` (a ``TASKCLAIM_*`` name; every one when ``None``) again on next use."""
        if setting is None:
            self._values.clear()
        elif setting.startswith("TASKCLAIM_"):
            name = setting.removeprefix("TASKCLAIM_")
            # The task databases are read together: each one's default depends on the others.
            for forgotten in _ROUTING if name in _ROUTING else (name,):
                self._values.pop(forgotten, None)

    @property
    def DEFAULT_LEASE(self) -> float:
        return float(self._get("DEFAULT_LEASE", 30.0))  # type: ignore[arg-type]

    @property
    def MAX_ATTEMPTS(self) -> int:
        return int(self._get("MAX_ATTEMPTS", 5))  # type: ignore[call-overload]

    @property
    def MAX_RESULT_BYTES(self) -> int:
        return int(self._get("MAX_RESULT_BYTES", 1024 * 1024))  # type: ignore[call-overload]

    @property
    def MAX_PAYLOAD_BYTES(self) -> int:
        return int(self._get("MAX_PAYLOAD_BYTES", 1024 * 1024))  # type: ignore[call-overload]

    @property
    def MAX_LEASE(self) -> float:
        return float(self._get("MAX_LEASE", 7 * 24 * 3600.0))  # type: ignore[arg-type]

    @property
    def SCHEDULES(self) -> object:
        """The raw ``TASKCLAIM_SCHEDULES``; read and checked by ``django_taskclaim.schedules``."""
        return self._get("SCHEDULES", {})

    @property
    def JSON_ENCODER(self) -> object:
        """A dotted path (or the class itself); resolved by ``values.json_encoder()``."""
        return self._get("JSON_ENCODER", "django.core.serializers.json.DjangoJSONEncoder")

    @property
    def DATABASE(self) -> str:
        value = self._values.get("DATABASE", _MISSING)
        if value is _MISSING:
            given = getattr(django_settings, "TASKCLAIM_DATABASE", None)
            listed = getattr(django_settings, "TASKCLAIM_DATABASES", None)
            if given is None:
                given = listed[0] if isinstance(listed, list | tuple) and listed else DEFAULT_DB_ALIAS
            value = self._values["DATABASE"] = str(given)
        return value  # type: ignore[return-value]

    @property
    def DATABASES(self) -> tuple[str, ...]:
        """Every task database, ``TASKCLAIM_DATABASE`` (the default one) included (check E008)."""
        value = self._values.get("DATABASES", _MISSING)
        if value is _MISSING:
            listed = getattr(django_settings, "TASKCLAIM_DATABASES", None)
            value = self._values["DATABASES"] = (self.DATABASE,) if not listed else tuple(
                str(alias) for alias in listed)
        return value  # type: ignore[return-value]

    @property
    def ROUTER(self) -> Callable[[str], str] | None:
        """The tenant router (imported from its dotted path once), or ``None`` without one."""
        value = self._values.get("ROUTER", _MISSING)
        if value is _MISSING:
            value = self._values["ROUTER"] = _import_router(getattr(django_settings, "TASKCLAIM_ROUTER", None))
        return value  # type: ignore[return-value]

    @property
    def AUDIT(self) -> bool:
        return bool(self._get("AUDIT", True))

    @property
    def DATABASE_TIMEOUT(self) -> float:
        """How long ``claim_next()`` over several task databases waits for one of them."""
        return float(self._get("DATABASE_TIMEOUT", 10.0))  # type: ignore[arg-type]

    @property
    def POLL_INTERVAL(self) -> float:
        return float(self._get("POLL_INTERVAL", 0.5))  # type: ignore[arg-type]

    @property
    def RETRY_BACKOFF(self) -> Backoff:
        """How long a failed queued task waits before its retry (a dict of ``Backoff``'s fields)."""
        from .retries import Backoff

        value = self._get("RETRY_BACKOFF", None)
        if not isinstance(value, Backoff):
            value = self._values["RETRY_BACKOFF"] = Backoff() if value is None else Backoff.of(
                value, "TASKCLAIM_RETRY_BACKOFF")
        return value

    @property
    def PREPARED_STATEMENTS(self) -> bool:
        return bool(self._get("PREPARED_STATEMENTS", True))

    @property
    def SIGNING_KEY(self) -> tuple[bytes, ...]:
        """``TASKCLAIM_SIGNING_KEY`` as keys, the one that signs first; empty when unset (calls go
        unsigned). ``ImproperlyConfigured`` names what is wrong (check E401 at start-up)."""
        value = self._values.get("SIGNING_KEY", _MISSING)
        if value is _MISSING:
            value = self._values["SIGNING_KEY"] = signing_keys(getattr(django_settings, "TASKCLAIM_SIGNING_KEY", None))
        return value  # type: ignore[return-value]


def signing_keys(value: object) -> tuple[bytes, ...]:
    """``TASKCLAIM_SIGNING_KEY`` (``None``, a key, or a non-empty list of keys; a key a non-empty str
    or bytes) as a tuple of byte strings; ``ImproperlyConfigured`` otherwise. An empty key is refused
    rather than read as "unsigned": it is more often an environment variable that was not set."""
    if value is None:
        return ()
    given = list(value) if isinstance(value, list | tuple) else [value]
    if not given:
        raise ImproperlyConfigured("TASKCLAIM_SIGNING_KEY is an empty list: give at least one key, or remove it")
    keys = []
    for key in given:
        if not isinstance(key, str | bytes):
            raise ImproperlyConfigured(f"TASKCLAIM_SIGNING_KEY must be a str or bytes key or a list of them, "
                                       f"not one of type {type(key).__name__}")
        if not key:
            raise ImproperlyConfigured("TASKCLAIM_SIGNING_KEY holds an empty key: a key that signs nothing")
        keys.append(key.encode() if isinstance(key, str) else key)
    return tuple(keys)


#: Settings read together (the router and the databases it may return).
_ROUTING = ("DATABASE", "DATABASES", "ROUTER")


def _import_router(value: object) -> Callable[[str], str] | None:
    """``TASKCLAIM_ROUTER`` as a callable: imported from a dotted path, or given as one.

    ``ImproperlyConfigured`` names what is wrong (check E007 reports the same at start-up).
    """
    if value is None:
        return None
    router = value
    if isinstance(value, str):
        try:
            router = import_string(value)
        except ImportError as exc:
            raise ImproperlyConfigured(f"TASKCLAIM_ROUTER = {value!r} cannot be imported: {exc}") from exc
    if not callable(router):
        raise ImproperlyConfigured(f"TASKCLAIM_ROUTER = {value!r} is not callable: it must take a tenant "
                                   "and return a database alias")
    return router


settings = TaskClaimSettings()


def _setting_changed(setting: str, **kwargs: Any) -> None:
    settings.forget(setting)


setting_changed.connect(_setting_changed, dispatch_uid="django_taskclaim.conf")
