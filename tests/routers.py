"""The database routers of the ``second_db`` and ``sharded`` test configurations (and of
docs/configurations.md).

django-taskclaim's tables live in the database named by ``TASKCLAIM_DATABASE``; so does the
test app's ``Effect``, the model the workers write inside ``claim.fenced()``: a fenced write
commits atomically with the completion only when both are in one database. So do the records
of ``django_taskclaim.downstream``, which commit with the ``Effect`` rows of a fenced view.
Every other app stays in "default".
"""

from __future__ import annotations

import zlib
from typing import Any

from django_taskclaim.conf import settings
from django_taskclaim.routing import fenced_database

WITH_TASKS = {"django_taskclaim", "taskclaim_downstream", "testapp"}


class TaskDatabaseRouter:
    def _db(self, app_label: str) -> str | None:
        return settings.DATABASE if app_label in WITH_TASKS else None

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self._db(model._meta.app_label)

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self._db(model._meta.app_label)

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        return None

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool | None:
        if app_label in WITH_TASKS:
            return db == settings.DATABASE
        return db == "default"


# ---- The sharded configurations: tenants routed over two task databases ----------------------

class TenantHash:
    """``TASKCLAIM_ROUTER`` of the sharded configurations: a stable hash of the tenant picks its
    database (the empty tenant's is ``default``). ``databases`` declares every alias it returns,
    for check E009."""

    databases = ("default", "shard2")

    def __call__(self, tenant: str) -> str:
        return self.databases[zlib.crc32(tenant.encode("utf-8", "surrogatepass")) % len(self.databases)]


tenant_database = TenantHash()


def tenants_on(alias: str, count: int, prefix: str = "t") -> list[str]:
    """``count`` tenant names that :data:`tenant_database` sends to ``alias``."""
    found = []
    n = 0
    while len(found) < count:
        if tenant_database(f"{prefix}{n}") == alias:
            found.append(f"{prefix}{n}")
        n += 1
    return found


class ShardRouter:
    """The Django database router of the sharded configurations: the test app's effects are
    written where the running ``fenced()`` block commits (its claim's database), and read there
    too inside one; elsewhere from ``default``. The task tables exist in every task database."""

    def _db(self, model: Any) -> str | None:
        return fenced_database() if model._meta.app_label == "testapp" else None

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self._db(model)

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self._db(model)

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        return None

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool | None:
        if app_label in WITH_TASKS:
            return db in settings.DATABASES
        return db == "default"

