"""The SQL that differs by database vendor, behind one small interface.

``get_backend(alias)`` returns the module-level backend object for the database that holds
the task table. Only PostgreSQL and SQLite are supported (``checks.py`` refuses the rest).
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.models import DateTimeField, Func

from .base import Backend

SUPPORTED_VENDORS = ("postgresql", "sqlite")


class DbNow(Func):
    """The database clock as an ORM expression: leases are compared with this, never ``timezone.now()``.

    PostgreSQL: ``statement_timestamp()`` (not ``now()``, which is frozen at the start of a
    possibly long transaction). SQLite: UTC, in the text form Django stores.
    """

    template = "statement_timestamp()"
    output_field = DateTimeField()

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple[Any, ...]]:
        from .sqlite import backend

        return backend.now, ()


class DbNowPlus(Func):
    """The database clock shifted by ``seconds`` (negative for the past), e.g. an age cutoff."""

    output_field = DateTimeField()

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = float(seconds)

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple[Any, ...]]:
        return "(statement_timestamp() + make_interval(secs => %s))", (self.seconds,)

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple[Any, ...]]:
        from .sqlite import backend

        return backend.lease_sql(), (f"{self.seconds:+.3f} seconds",)


def get_backend(alias: str) -> Backend:
    """The backend for database ``alias``; ``ImproperlyConfigured`` for unsupported vendors."""
    vendor = connections[alias].vendor
    if vendor == "postgresql":
        from .postgresql import backend as pg

        return pg
    if vendor == "sqlite":
        from .sqlite import backend as lite

        return lite
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"django-taskclaim supports PostgreSQL and SQLite; database {alias!r} is {vendor!r}"
    )
