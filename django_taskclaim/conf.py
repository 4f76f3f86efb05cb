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
``TASKCLAIM_DATABASE``               str        default       Database alias that holds the task table.
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
``TASKCLAIM_CELERY_APP``             str        ``None``      Dotted path of the Celery app the bridge's
                                                              checks inspect (default: the project's app, as
                                                              ``celery -A proj`` finds it;
                                                              read and validated by ``django_taskclaim.celery``).
===================================  =========  ============  ==============================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS

if TYPE_CHECKING:
    from .retries import Backoff

_MISSING = object()


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
            self._values.pop(setting.removeprefix("TASKCLAIM_"), None)

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
    def JSON_ENCODER(self) -> object:
        """A dotted path (or the class itself); resolved by ``keys.json_encoder()``."""
        return self._get("JSON_ENCODER", "django.core.serializers.json.DjangoJSONEncoder")

    @property
    def DATABASE(self) -> str:
        return str(self._get("DATABASE", DEFAULT_DB_ALIAS))

    @property
    def AUDIT(self) -> bool:
        return bool(self._get("AUDIT", True))

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


settings = TaskClaimSettings()


def _setting_changed(setting: str, **kwargs: Any) -> None:
    settings.forget(setting)


setting_changed.connect(_setting_changed, dispatch_uid="django_taskclaim.conf")
