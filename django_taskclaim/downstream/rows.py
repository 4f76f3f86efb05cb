"""The row locks that make one call at a time per key: found and locked, or inserted and held."""

from __future__ import annotations

from typing import Any, TypeVar

from django.db import IntegrityError, connections, models, transaction

from .models import FencingMark

M = TypeVar("M", bound=models.Model)


def take_write_lock(using: str) -> None:
    """On SQLite, take the database's write lock now, as the transaction's first statement.

    A deferred transaction that reads first cannot upgrade its lock while another connection
    writes: SQLite answers "database is locked" at once instead of waiting for the busy timeout.
    A write that matches nothing takes the lock and waits for it like any other write. Other
    databases lock rows (``SELECT ... FOR UPDATE``) and need nothing here.
    """
    connection = connections[using]
    if connection.vendor == "sqlite":
        table = connection.ops.quote_name(FencingMark._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {table} SET token = token WHERE 0 = 1")  # noqa: S608 (a table name)


def lock_or_insert(model: type[M], using: str, lookup: dict[str, Any], values: dict[str, Any]) -> tuple[M, bool]:
    """The row of ``lookup``, locked until the transaction ends; inserted with ``values`` if absent.

    Two transactions inserting one key: the second's INSERT waits on the unique index until the
    first ends (PostgreSQL, InnoDB). If the first committed, the INSERT fails and the row, now
    visible, is locked and returned; if it rolled back, the INSERT succeeds. The savepoint keeps
    PostgreSQL's transaction usable after the failed INSERT.
    """
    rows = model._default_manager.using(using).select_for_update()
    found = rows.filter(**lookup).first()
    if found is not None:
        return found, False
    try:
        with transaction.atomic(using=using):
            return model._default_manager.using(using).create(**lookup, **values), True
    except IntegrityError:
        found = rows.filter(**lookup).first()
        if found is None:  # not the race on this key: another constraint failed
            raise
        return found, False
