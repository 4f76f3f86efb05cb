"""Concurrency limits: a task's ``concurrency_key`` and ``concurrency_limit``, and the index by which
the queue claim counts a key's running and pending tasks; the gate table, one row per concurrency key,
that serialises the claims of one key on PostgreSQL and MySQL (models.ConcurrencyGate).

``concurrency_key`` keeps its default ``''`` in the database (Django drops a field's default after
adding the column): the stores' own inserts name only the columns they set. Both columns have a
constant default, a quick ALTER on PostgreSQL 11+, MySQL 8 and MariaDB 10.3+. On MySQL/MariaDB the
key compares exactly (a binary collation, as a task's ``key`` since migration 0002): ``API`` and
``api`` are two keys.
"""

from django.db import migrations, models

TABLE = "django_taskclaim_task"
GATE = "django_taskclaim_concurrencygate"


def add_key_column(apps, schema_editor):
    connection, q = schema_editor.connection, schema_editor.quote_name
    column = "VARCHAR(255)"
    if connection.vendor == "mysql":
        column = f"VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {_collation(connection)}"
    schema_editor.execute(f"ALTER TABLE {q(TABLE)} ADD COLUMN {q('concurrency_key')} {column} NOT NULL DEFAULT ''")


def exact_gate_keys(apps, schema_editor):
    connection, q = schema_editor.connection, schema_editor.quote_name
    if connection.vendor == "mysql":
        schema_editor.execute(f"ALTER TABLE {q(GATE)} DEFAULT CHARACTER SET utf8mb4, "
                              f"MODIFY {q('key')} VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {_collation(connection)} "
                              f"NOT NULL")


def _collation(connection):
    if connection.mysql_is_mariadb:
        return "utf8mb4_nopad_bin"
    return "utf8mb4_0900_bin" if connection.mysql_version >= (8, 0, 17) else "utf8mb4_bin"


def drop_key_column(apps, schema_editor):
    q = schema_editor.quote_name
    schema_editor.execute(f"ALTER TABLE {q(TABLE)} DROP COLUMN {q('concurrency_key')}")


class Migration(migrations.Migration):
    dependencies = [("django_taskclaim", "0005_coalesce_group")]
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddField(
                model_name="task", name="concurrency_key",
                field=models.CharField(blank=True, default="", max_length=255, verbose_name="concurrency key"),
            )],
            database_operations=[migrations.RunPython(add_key_column, drop_key_column)],
        ),
        migrations.AddField(
            model_name="task", name="concurrency_limit",
            field=models.PositiveIntegerField(blank=True, null=True, verbose_name="concurrency limit"),
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(fields=["concurrency_key", "status"], name="taskclaim_task_limit_idx"),
        ),
        migrations.CreateModel(
            name="ConcurrencyGate",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("key", models.CharField(max_length=255, unique=True, verbose_name="concurrency key")),
                ("version", models.BigIntegerField(default=0, verbose_name="version")),
            ],
            options={"verbose_name": "concurrency gate", "verbose_name_plural": "concurrency gates"},
        ),
        migrations.RunPython(exact_gate_keys, migrations.RunPython.noop, atomic=False),
    ]
