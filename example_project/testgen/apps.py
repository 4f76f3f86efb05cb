from typing import Any

from django.apps import AppConfig
from django.db.backends.signals import connection_created


def sqlite_wal(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Put SQLite in WAL mode: readers (the jobs page) never block the agents' writes."""
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")


class TestgenConfig(AppConfig):
    name = "example_project.testgen"
    label = "testgen"
    verbose_name = "Test generation"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        connection_created.connect(sqlite_wal, dispatch_uid="testgen-sqlite-wal")
