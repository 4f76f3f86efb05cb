"""System checks: IDs, messages and hints kept together here.

=====================  ====================================================================
ID                     Problem
=====================  ====================================================================
``django_taskclaim.E001``  The task database is neither PostgreSQL nor SQLite.
``django_taskclaim.E002``  SQLite older than 3.35 (no ``RETURNING``).
``django_taskclaim.E003``  SQLite with ``USE_TZ = False`` (leases are compared in UTC).
``django_taskclaim.E004``  ``TASKCLAIM_DATABASE`` names no configured database.
``django_taskclaim.E005``  A ``TASKCLAIM_*`` setting has the wrong type or range.
=====================  ====================================================================
"""

from __future__ import annotations

import sqlite3
from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.db import connections

from .backends import SUPPORTED_VENDORS
from .conf import settings

E001 = ("django_taskclaim.E001", "Database {alias!r} ({vendor}) is not supported by django-taskclaim.",
        "Use PostgreSQL (production) or SQLite (development) for the task table; set "
        "TASKCLAIM_DATABASE to an alias of one of them.")
E002 = ("django_taskclaim.E002", "SQLite {version} is too old for django-taskclaim.",
        "Claims need SQLite 3.35 or newer (UPDATE … RETURNING); upgrade the SQLite library.")
E003 = ("django_taskclaim.E003", "USE_TZ is False with SQLite.",
        "Leases are compared with SQLite's UTC clock; set USE_TZ = True.")
E004 = ("django_taskclaim.E004", "TASKCLAIM_DATABASE = {alias!r} is not in DATABASES.",
        "Set TASKCLAIM_DATABASE to one of: {aliases}.")
E005 = ("django_taskclaim.E005", "{name} = {value!r} is invalid: {problem}.",
        "Fix the setting; see the settings reference in the docs.")


def _error(spec: tuple[str, str, str], **fmt: Any) -> checks.Error:
    check_id, msg, hint = spec
    return checks.Error(msg.format(**fmt), hint=hint.format(**fmt), id=check_id)


def check_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The task database must be PostgreSQL or a recent SQLite (no query is made)."""
    alias = settings.DATABASE
    if alias not in django_settings.DATABASES:
        return [_error(E004, alias=alias, aliases=", ".join(django_settings.DATABASES))]
    vendor = connections[alias].vendor
    if vendor not in SUPPORTED_VENDORS:
        return [_error(E001, alias=alias, vendor=vendor)]
    errors: list[checks.CheckMessage] = []
    if vendor == "sqlite":
        if sqlite3.sqlite_version_info < (3, 35):
            errors.append(_error(E002, version=sqlite3.sqlite_version))
        if not django_settings.USE_TZ:
            errors.append(_error(E003))
    return errors


_NUMERIC = {
    "TASKCLAIM_DEFAULT_LEASE": (int, float),
    "TASKCLAIM_MAX_ATTEMPTS": (int,),
    "TASKCLAIM_MAX_RESULT_BYTES": (int,),
    "TASKCLAIM_POLL_INTERVAL": (int, float),
}


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Each numeric ``TASKCLAIM_*`` setting must be a positive number of the right type."""
    errors: list[checks.CheckMessage] = []
    for name, types in _NUMERIC.items():
        if not hasattr(django_settings, name):
            continue
        value = getattr(django_settings, name)
        if isinstance(value, bool) or not isinstance(value, types):
            errors.append(_error(E005, name=name, value=value,
                                 problem=f"expected {' or '.join(t.__name__ for t in types)}"))
        elif value <= 0:
            errors.append(_error(E005, name=name, value=value, problem="must be greater than zero"))
    return errors


def register() -> None:
    checks.register(check_database)
    checks.register(check_settings)
