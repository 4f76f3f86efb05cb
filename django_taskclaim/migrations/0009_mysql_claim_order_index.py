"""MySQL/MariaDB only: the queue claim's index in claim order, ``(status, queue, priority DESC, id)``.

Migration 0004's ``(status, queue, priority, id)`` cannot give ``ORDER BY priority DESC, id``, so
InnoDB sorted a queue's whole backlog for every claim, and a ``FOR UPDATE`` read keeps every row
it sorted locked until the claim commits: a racing claim skipped them all (``SKIP LOCKED``) and
came away empty while work waited, which under a concurrency limit left a free place of a key
unclaimed. In claim order the scan stops at the claim's ``LIMIT``, locking only what it takes.
MySQL 8 and MariaDB 10.8+ keep the descending column; MariaDB 10.6 and 10.7 ignore ``DESC``
(docs/databases.md). The new index is built before the old one is dropped (both online in InnoDB).
PostgreSQL and SQLite have the partial ``(queue, priority DESC, id)`` index since 0004.
"""

from django.db import migrations

TABLE = "django_taskclaim_task"
OLD = "taskclaim_task_status_queue_idx"
NEW = "taskclaim_task_claim_order_idx"


def in_claim_order(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        table = schema_editor.quote_name(TABLE)
        schema_editor.execute(f"CREATE INDEX {NEW} ON {table} (status, queue, priority DESC, id)")
        schema_editor.execute(f"DROP INDEX {OLD} ON {table}")


def back_to_ascending(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        table = schema_editor.quote_name(TABLE)
        schema_editor.execute(f"CREATE INDEX {OLD} ON {table} (status, queue, priority, id)")
        schema_editor.execute(f"DROP INDEX {NEW} ON {table}")


class Migration(migrations.Migration):
    dependencies = [("django_taskclaim", "0008_concurrency_limits")]
    operations = [migrations.RunPython(in_claim_order, back_to_ascending, atomic=False)]
