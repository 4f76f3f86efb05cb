"""Coalescing groups (``@coalesced`` Django tasks): one row per ``(tenant, name)`` with the id of the
group's latest task, the row an enqueue locks to decide "this waiting task, or a new one".

On MySQL/MariaDB the group's ``tenant`` and ``name`` compare exactly, as a task's ``tenant`` and
``key`` do since migration 0002 (utf8mb4 with a binary collation that also compares trailing
spaces): with the default collation ``reindex:A`` and ``reindex:a `` would be one group. 455
utf8mb4 characters are 1,820 bytes: the unique index is under InnoDB's 3,072. Nothing more to do
on PostgreSQL and SQLite. The table is new, so every statement here is quick on a live database.
"""

from django.db import migrations, models

TABLE = "django_taskclaim_coalescegroup"


def exact_names(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    if connection.mysql_is_mariadb:
        collation = "utf8mb4_nopad_bin"
    else:
        collation = "utf8mb4_0900_bin" if connection.mysql_version >= (8, 0, 17) else "utf8mb4_bin"
    q = schema_editor.quote_name
    schema_editor.execute(
        f"ALTER TABLE {q(TABLE)} DEFAULT CHARACTER SET utf8mb4, "
        f"MODIFY {q('tenant')} VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL, "
        f"MODIFY {q('name')} VARCHAR(200) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL"
    )


class Migration(migrations.Migration):
    dependencies = [("django_taskclaim", "0004_queues")]
    operations = [
        migrations.CreateModel(
            name="CoalesceGroup",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("tenant", models.CharField(blank=True, default="", max_length=255, verbose_name="tenant")),
                ("name", models.CharField(max_length=200, verbose_name="group")),
                ("task_id", models.BigIntegerField(blank=True, null=True, verbose_name="latest task")),
            ],
            options={
                "verbose_name": "coalescing group",
                "verbose_name_plural": "coalescing groups",
                "constraints": [models.UniqueConstraint(fields=("tenant", "name"),
                                                        name="taskclaim_group_tenant_name_uniq")],
            },
        ),
        migrations.RunPython(exact_names, migrations.RunPython.noop, atomic=False),
    ]
