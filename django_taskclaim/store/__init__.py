"""The store: all SQL of the app, one module per database, behind one Protocol.

``VENDORS`` is the registry: Django's ``connection.vendor`` -> the store for it. The lifecycle
asks ``get_store(alias)``; the system checks ask :func:`system_check` (E001 for a vendor with no
store here, else the store's own ``system_check``) and :func:`server_check`; ``DbNow``/``DbNowPlus`` put the database
clock into ORM queries. Adding a database is one store module and one line here.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from django.core.checks import CheckMessage
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.models import DateTimeField, Func

from ..checkspec import spec
from . import mysql, postgresql, sqlite
from .protocol import Store

VENDORS: dict[str, Store] = {
    "postgresql": postgresql.store,
    "sqlite": sqlite.store,
    "mysql": mysql.store,  # MySQL 8 and MariaDB 10.6+ (Django's vendor "mysql" for both)
}


E001 = spec("django_taskclaim.E001", "Database {alias!r} ({vendor}) is not supported by django-taskclaim.",
            "Use PostgreSQL or MySQL/MariaDB (production) or SQLite (development) for the task "
            "table; set TASKCLAIM_DATABASE to an alias of one of them.")


def system_check(alias: str, db: Any) -> list[CheckMessage]:
    """The system check of the task database ``alias`` (Django connection ``db``): E001 where no
    store serves its vendor, else what its store finds (``Store.system_check``)."""
    found = VENDORS.get(db.vendor)
    if found is None:
        return [E001.error(alias=alias, vendor=db.vendor)]
    return found.system_check(alias, db)


def server_check(alias: str, db: Any) -> list[CheckMessage]:
    """The queried part of the check of task database ``alias`` (``Store.server_check``); nothing
    for a vendor with no store (:func:`system_check` reports E001)."""
    found = VENDORS.get(db.vendor)
    return [] if found is None else found.server_check(alias, db)


def get_store(alias: str) -> Store:
    """The store for database ``alias``; ``ImproperlyConfigured`` for an unsupported vendor."""
    return store_of(connections[alias])


def store_now(alias: str) -> datetime:
    """The clock of database ``alias`` (as the leases use it), never this process's clock."""
    store = get_store(alias)
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT {store.now}", [])
        value = store.to_datetime(cursor.fetchone()[0])
    if value is None:  # pragma: no cover - a database without a clock
        raise RuntimeError(f"database {alias!r} returned no current time")
    return value


def store_of(db: Any) -> Store:
    """The store for Django connection ``db``; ``ImproperlyConfigured`` for an unsupported vendor."""
    try:
        return VENDORS[db.vendor]
    except KeyError:
        raise ImproperlyConfigured(
            f"django-taskclaim supports {', '.join(sorted(VENDORS))}; database {db.alias!r} is {db.vendor!r}"
        ) from None


def read_only(db: Any, cursor: Any) -> AbstractContextManager[None] | str:
    """:meth:`Store.read_only` for Django connection ``db``, a database of any vendor (a ``fenced()``
    block's other databases need not be task databases): a sentence saying why not for a vendor
    with no store here."""
    found = VENDORS.get(db.vendor)
    if found is None:
        return f"is {db.vendor}, which django-taskclaim cannot make refuse writes"
    return found.read_only(db, cursor)


def refused_write(db: Any, error: BaseException) -> bool:
    """:meth:`Store.refused_write` of Django connection ``db``'s vendor (``False`` for one with no store)."""
    found = VENDORS.get(db.vendor)
    return found is not None and found.refused_write(error)


class DbNow(Func):
    """The database clock as an ORM expression: leases are compared with this, never ``timezone.now()``."""

    output_field = DateTimeField()

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple[Any, ...]]:  # type: ignore[override]
        return VENDORS[connection.vendor].now, ()


class DbNowPlus(Func):
    """The database clock shifted by ``seconds`` (negative for the past), e.g. an age cutoff."""

    output_field = DateTimeField()

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = float(seconds)

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple[Any, ...]]:  # type: ignore[override]
        sql, params = VENDORS[connection.vendor].shifted_now(self.seconds)
        return sql, tuple(params)


__all__ = ["VENDORS", "DbNow", "DbNowPlus", "Store", "get_store", "read_only", "refused_write", "server_check",
           "store_now", "store_of", "system_check"]
