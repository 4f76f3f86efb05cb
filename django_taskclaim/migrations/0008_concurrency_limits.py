"""Concurrency limits: a task's ``concurrency_key`` and ``concurrency_limit``, and the index by which
the queue claim counts a key's running and pending tasks; the gate table, one row per concurrency key,
that serialises the claims of one key on PostgreSQL and MySQL (models.ConcurrencyGate); on PostgreSQL,
the two functions its queue claim calls (``taskclaim_room``, ``taskclaim_fit``).

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


# PostgreSQL's queue claim is one statement, whose snapshot is taken before it locks anything: the
# count that decides a key's last place must be read after the key's gate is locked, in a snapshot
# of its own, which a VOLATILE function's statements take (store/postgresql.py, ``_limits``).
ROOM = """
CREATE OR REPLACE FUNCTION taskclaim_room(task bigint, finishing bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM django_taskclaim_task r WHERE r.concurrency_key = t.concurrency_key
            AND r.status = 'running' AND r.id IS DISTINCT FROM finishing) < t.concurrency_limit
    FROM django_taskclaim_task t WHERE t.id = task
$$
"""
# Of the tasks ``ids`` (locked by the calling claim), those it may claim: all of them when none is a
# pending task of a limited key; else, after each such key's gate is locked (in key order), every
# other one, and of each key's pending tasks, in claim order, those whose place among them plus the
# key's running tasks (``finishing`` aside) is within their own limit.
FIT = """
CREATE OR REPLACE FUNCTION taskclaim_fit(ids bigint[], finishing bigint) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM django_taskclaim_task t WHERE t.id = ANY(ids) AND t.concurrency_key <> ''
                   AND t.status = 'pending') THEN
        RETURN QUERY SELECT unnest(ids);
        RETURN;
    END IF;
    INSERT INTO django_taskclaim_concurrencygate AS g ("key", version)
    SELECT DISTINCT t.concurrency_key, 1 FROM django_taskclaim_task t
    WHERE t.id = ANY(ids) AND t.concurrency_key <> '' AND t.status = 'pending' ORDER BY 1
    ON CONFLICT ("key") DO UPDATE SET version = g.version + 1;
    RETURN QUERY SELECT h.id FROM (
        SELECT t.id, t.concurrency_key AS ck, t.concurrency_limit AS cl,
               t.concurrency_key <> '' AND t.status = 'pending' AS limited,
               row_number() OVER (PARTITION BY t.concurrency_key, t.status ORDER BY t.priority DESC, t.id) AS place
        FROM django_taskclaim_task t WHERE t.id = ANY(ids)) h
    WHERE NOT h.limited
       OR (SELECT count(*) FROM django_taskclaim_task r WHERE r.concurrency_key = h.ck
           AND r.status = 'running' AND r.id IS DISTINCT FROM finishing) + h.place <= h.cl;
END
$$
"""


def add_functions(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ROOM)
        schema_editor.execute(FIT)


def drop_functions(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS taskclaim_fit(bigint[], bigint)")
        schema_editor.execute("DROP FUNCTION IF EXISTS taskclaim_room(bigint, bigint)")


def drop_key_column(apps, schema_editor):
    q = schema_editor.quote_name
    schema_editor.execute(f"ALTER TABLE {q(TABLE)} DROP COLUMN {q('concurrency_key')}")


class Migration(migrations.Migration):
    dependencies = [("django_taskclaim", "0007_outbox")]
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
        migrations.RunPython(add_functions, drop_functions),
    ]
