"""MySQL/MariaDB only: the index their claims need in place of the partial indexes.

MySQL has no partial indexes (Django skips ``Index(condition=...)`` there, with warning
models.W037), so the queue claims (``status = 'pending' ORDER BY id``, expired running
tasks) would walk the primary key past every finished task. An index on ``(status, id)``
serves both. Nothing to do on PostgreSQL and SQLite, whose partial indexes exist.
"""

from django.db import migrations

INDEX = "taskclaim_task_status_id_idx"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        schema_editor.execute(f"CREATE INDEX {INDEX} ON django_taskclaim_task (status, id)")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        schema_editor.execute(f"DROP INDEX {INDEX} ON django_taskclaim_task")


class Migration(migrations.Migration):
    dependencies = [("django_taskclaim", "0001_initial")]
    operations = [migrations.RunPython(create, drop, atomic=False)]
