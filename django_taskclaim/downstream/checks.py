"""The system checks of signed calls and of ``fenced_endpoint``'s app (docs/downstream.md).

E401 (a ``TASKCLAIM_SIGNING_KEY`` that cannot be used) runs on both sides; W402 (calls unsigned)
on the downstream's, where forged tokens would be believed; E403 (``fenced_endpoint`` used without
``django_taskclaim.downstream`` installed) from the task app, the only app installed then whose
checks run. None imports the downstream's models: E403 runs where they have no table.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from django.apps import apps
from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.urls import get_resolver

from ..checkspec import spec
from ..conf import signing_keys

E401 = spec("django_taskclaim.E401", "TASKCLAIM_SIGNING_KEY is unusable: {problem}.",
            "Set it to a secret shared with the other side (a str, or a list of them on a downstream "
            "rotating keys), e.g. read from the environment; remove it to send and accept unsigned calls.")
W402 = spec("django_taskclaim.W402", "fenced_endpoint accepts unsigned calls: anyone who can reach it can forge a "
            "Taskclaim-Fencing-Token (the highest there is locks every later owner of the task out).",
            "Set TASKCLAIM_SIGNING_KEY, on this service and where the calls are made (workers, relays), to "
            "one shared secret: calls then carry Taskclaim-Signature and unsigned ones are refused (401).")
E403 = spec("django_taskclaim.E403", "fenced_endpoint is used, but 'django_taskclaim.downstream' is not in "
            "INSTALLED_APPS: its tables do not exist, and every call would fail with a server error.",
            "Add 'django_taskclaim.downstream' to INSTALLED_APPS and run migrate.")

DOWNSTREAM_APP = "django_taskclaim.downstream"


def check_signing_key(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``TASKCLAIM_SIGNING_KEY``, when set, must be a key or a non-empty list of non-empty keys (E401)."""
    try:
        signing_keys(getattr(django_settings, "TASKCLAIM_SIGNING_KEY", None))
    except ImproperlyConfigured as exc:
        return [E401.error(problem=str(exc).removeprefix("TASKCLAIM_SIGNING_KEY "))]
    return []


def check_unsigned(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A downstream without ``TASKCLAIM_SIGNING_KEY`` believes any token it is sent (W402)."""
    if getattr(django_settings, "TASKCLAIM_SIGNING_KEY", None) is None:
        return [W402.warning()]
    return []


def check_installed(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``fenced_endpoint`` imported by the project's URLs while its app is not installed (E403): its
    models then belong to the task app, whose migrations never create their tables."""
    if apps.is_installed(DOWNSTREAM_APP):
        return []
    # Django's own URL check reports a URLconf that does not import.
    with contextlib.suppress(Exception):
        get_resolver().url_patterns  # noqa: B018 - imports the URLconf and the views it names
    if f"{DOWNSTREAM_APP}.endpoint" in sys.modules:
        return [E403.error()]
    return []


def register_downstream() -> None:
    """The checks of the downstream's app (its ``ready()``)."""
    checks.register(check_signing_key)
    checks.register(check_unsigned)


def register_caller() -> None:
    """The checks the task app runs for the calls it makes and for a misplaced ``fenced_endpoint``."""
    checks.register(check_signing_key)
    checks.register(check_installed)
