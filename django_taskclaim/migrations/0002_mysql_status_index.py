"""MySQL/MariaDB only: the index their claims need, and exact comparison of task identities.

- MySQL has no partial indexes (Django skips ``Index(condition=...)`` there, with warning
  models.W037), so the queue claims (``status = 'pending' ORDER BY id``, expired running
  tasks) would walk the primary key past every finished task. An index on ``(status, id)``
  serves both.
- ``tenant`` and ``key`` identify a task exactly, as on PostgreSQL and SQLite. The default
  collations of MySQL and MariaDB are case- and accent-insensitive and ignore trailing spaces
  (``'a' = 'A '``), which would make distinct keys one task (and one unique-index entry).
  Both columns become utf8mb4 (whatever the database's charset) with a binary collation that
  also compares trailing spaces: ``utf8mb4_nopad_bin`` on MariaDB, ``utf8mb4_0900_bin`` on
  MySQL 8.0.17+ (older MySQL 8 has only ``utf8mb4_bin``, which pads). 255 utf8mb4 characters
  are 1,020 bytes: the unique ``(tenant, key)`` index is 2,040 bytes, under InnoDB's 3,072.

Nothing to do on PostgreSQL and SQLite, whose partial indexes exist and whose text compares
exactly.
"""

from django.db import migrations

INDEX = "taskclaim_task_status_id_idx"
TABLE = "django_taskclaim_task"


def identity_collation(connection) -> str:
    if connection.mysql_is_mariadb:
        return "utf8mb4_nopad_bin"
    return "utf8mb4_0900_bin" if connection.mysql_version >= (8, 0, 17) else "utf8mb4_bin"


def _identity_columns(schema_editor, collation: str) -> None:
    q = schema_editor.quote_name
    schema_editor.execute(
        f"ALTER TABLE {q(TABLE)} "
        f"MODIFY {q('tenant')} VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL, "
        f"MODIFY {q('key')} VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL"
    )


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        schema_editor.execute(f"CREATE INDEX {INDEX} ON {TABLE} (status, id)")
        _identity_columns(schema_editor, identity_collation(schema_editor.connection))


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        schema_editor.execute(f"DROP INDEX {INDEX} ON {TABLE}")
        _identity_columns(schema_editor, "utf8mb4_unicode_ci")


class Migration(migrations.Migration):
    dependencies = [("django_taskclaim", "0001_initial")]
    operations = [migrations.RunPython(create, drop, atomic=False)]
