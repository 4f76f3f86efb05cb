"""The app's own system checks: the task database's alias and store, and the ``TASKCLAIM_*`` settings.

Each database answers for itself (``store.system_check``: E001, then the store's own E002, E003,
E010, W020, W021…), each integration too (``contrib.INTEGRATIONS``: the Celery bridge's E101,
W101–W106). Every ID is declared with ``checkspec.spec``, which refuses one declared twice;
docs/reference.md lists them all.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from . import store
from .checkspec import spec
from .conf import settings
from .exceptions import InvalidLease
from .keys import LEASE_CEILING, MAX_INT, json_encoder, lease_seconds

E004 = spec("django_taskclaim.E004", "TASKCLAIM_DATABASE = {alias!r} is not in DATABASES.",
            "Set TASKCLAIM_DATABASE to one of: {aliases}.")
E005 = spec("django_taskclaim.E005", "{name} = {value!r} is invalid: {problem}.",
            "Fix the setting; see the settings reference in the docs.")
E006 = spec("django_taskclaim.E006", "{problem}",
            "Set TASKCLAIM_JSON_ENCODER to the dotted path of a json.JSONEncoder subclass, e.g. "
            "'django.core.serializers.json.DjangoJSONEncoder' (the default).")


def check_database(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The task database must be configured and have a store (E001); its store checks the rest.

    A store queries its server only where Django asks for the database checks of the task
    database (``check --database``, ``migrate``), except for the server's version (read once
    per process by Django anyway).
    """
    alias = settings.DATABASE
    if alias not in django_settings.DATABASES:
        return [E004.error(alias=alias, aliases=", ".join(django_settings.DATABASES))]
    return store.system_check(alias, connections[alias], query=alias in (databases or ()))


_NUMERIC = {
    "TASKCLAIM_DEFAULT_LEASE": (int, float),
    "TASKCLAIM_MAX_ATTEMPTS": (int,),
    "TASKCLAIM_MAX_RESULT_BYTES": (int,),
    "TASKCLAIM_POLL_INTERVAL": (int, float),
    "TASKCLAIM_MAX_PAYLOAD_BYTES": (int,),
    "TASKCLAIM_MAX_LEASE": (int, float),
}
# Upper bounds: what an integer column holds, and expiry dates the ORM can still load.
_MAXIMUM = {"TASKCLAIM_MAX_ATTEMPTS": MAX_INT, "TASKCLAIM_MAX_LEASE": LEASE_CEILING}


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Each numeric ``TASKCLAIM_*`` setting must be a positive number of the right type."""
    errors: list[checks.CheckMessage] = []
    for name, types in _NUMERIC.items():
        if not hasattr(django_settings, name):
            continue
        value = getattr(django_settings, name)
        if isinstance(value, bool) or not isinstance(value, types):
            errors.append(E005.error(name=name, value=value,
                                 problem=f"expected {' or '.join(t.__name__ for t in types)}"))
        elif value <= 0:
            errors.append(E005.error(name=name, value=value, problem="must be greater than zero"))
        elif name in _MAXIMUM and value > _MAXIMUM[name]:
            errors.append(E005.error(name=name, value=value, problem=f"must be at most {_MAXIMUM[name]:g}"))
    if not errors and hasattr(django_settings, "TASKCLAIM_DEFAULT_LEASE"):
        try:
            lease_seconds(None)  # between the minimum lease and TASKCLAIM_MAX_LEASE
        except InvalidLease as exc:
            errors.append(E005.error(name="TASKCLAIM_DEFAULT_LEASE", value=settings.DEFAULT_LEASE,
                                 problem=str(exc)))
    try:
        json_encoder()
    except ImproperlyConfigured as exc:
        errors.append(E006.error(problem=str(exc)))
    return errors


def register() -> None:
    checks.register(check_database, checks.Tags.database)
    checks.register(check_settings)
