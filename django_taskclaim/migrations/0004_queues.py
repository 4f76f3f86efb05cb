"""Queued work: a task's queue, priority, "not before" time and the path of what runs it; each
attempt's error and traceback.

- Tasks claimed by key (``claim()``, ``run_once``, the Celery bridge, LangGraph nodes) keep a
  NULL queue: ``claim_next()`` never hands them out. Tasks that ``ensure()`` made for queue
  workers (pending, never claimed, no Celery dispatch) go to the ``default`` queue, where a
  worker that names no queue finds them, as before.
- The queue claim's index: a queue's pending tasks by priority, then age (``-priority, id``),
  partial on PostgreSQL and SQLite, built without blocking writes on PostgreSQL (``CREATE
  INDEX CONCURRENTLY``: this migration is not atomic there). MySQL/MariaDB have no partial
  indexes: a ``(status, queue, priority, id)`` index instead, beside migration 0002's.
"""

from django.db import migrations, models

INDEX = "taskclaim_task_queued_idx"
MYSQL_INDEX = "taskclaim_task_status_queue_idx"
TABLE = "django_taskclaim_task"

queued_index = models.Index(
    condition=models.Q(("queue__isnull", False), ("status", "pending")),
    fields=["queue", "-priority", "id"], name=INDEX,
)


def queue_waiting_work(apps, schema_editor):
    Task = apps.get_model("django_taskclaim", "Task")
    Task.objects.using(schema_editor.connection.alias).filter(
        status="pending", attempts=0, dispatch__isnull=True, queue__isnull=True).update(queue="default")


def add_index(apps, schema_editor):
    vendor, q = schema_editor.connection.vendor, schema_editor.quote_name
    if vendor == "mysql":
        schema_editor.execute(f"CREATE INDEX {MYSQL_INDEX} ON {q(TABLE)} (status, queue, priority, id)")
    elif vendor == "postgresql":
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} ON {q(TABLE)} (queue, priority DESC, id) "
            f"WHERE (queue IS NOT NULL AND status = 'pending')")
    else:
        schema_editor.add_index(apps.get_model("django_taskclaim", "Task"), queued_index)


def drop_index(apps, schema_editor):
    vendor, q = schema_editor.connection.vendor, schema_editor.quote_name
    if vendor == "mysql":
        schema_editor.execute(f"DROP INDEX {MYSQL_INDEX} ON {q(TABLE)}")
    else:
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


def restore_pending_index(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        schema_editor.execute(f"CREATE INDEX taskclaim_task_pending_idx ON {schema_editor.quote_name(TABLE)} (id) "
                              f"WHERE status = 'pending'")


def drop_pending_index(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":  # never created there (no partial indexes)
        schema_editor.execute("DROP INDEX IF EXISTS taskclaim_task_pending_idx")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY on PostgreSQL

    dependencies = [
        ("django_taskclaim", "0003_mysql_utf8mb4"),
    ]

    operations = [
        migrations.AddField(
            model_name="attempt",
            name="error",
            field=models.TextField(blank=True, default="", verbose_name="error"),
        ),
        migrations.AddField(
            model_name="attempt",
            name="error_class",
            field=models.CharField(blank=True, default="", max_length=255, verbose_name="error class"),
        ),
        migrations.AddField(
            model_name="attempt",
            name="traceback",
            field=models.TextField(blank=True, default="", verbose_name="traceback"),
        ),
        migrations.AddField(
            model_name="task",
            name="priority",
            field=models.SmallIntegerField(default=0, verbose_name="priority"),
        ),
        migrations.AddField(
            model_name="task",
            name="queue",
            field=models.CharField(blank=True, default=None, max_length=100, null=True, verbose_name="queue"),
        ),
        migrations.AddField(
            model_name="task",
            name="run_after",
            field=models.DateTimeField(blank=True, null=True, verbose_name="not before"),
        ),
        migrations.AddField(
            model_name="task",
            name="task_path",
            field=models.CharField(blank=True, default="", max_length=255, verbose_name="task path"),
        ),
        migrations.RunPython(queue_waiting_work, migrations.RunPython.noop),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="task", name="taskclaim_task_pending_idx"),
                migrations.AddIndex(model_name="task", index=queued_index),
            ],
            database_operations=[
                migrations.RunPython(add_index, drop_index),
                migrations.RunPython(drop_pending_index, restore_pending_index),
            ],
        ),
    ]
