"""The database router of the ``second_db`` test configuration (and of docs/configurations.md).

django-taskclaim's tables live in the database named by ``TASKCLAIM_DATABASE``; so does the
test app's ``Effect``, the model the workers write inside ``claim.fenced()``: a fenced write
commits atomically with the completion only when both are in one database. Every other app
stays in "default".
"""

from __future__ import annotations

from typing import Any

from django_taskclaim.conf import settings

WITH_TASKS = {"django_taskclaim", "testapp"}


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
