"""PostgreSQL only: wake idle queue workers when a task becomes claimable (``LISTEN``/``NOTIFY``).

Two row triggers on the task table call one function that notifies the channel
``taskclaim_wakeup`` with the task's queue, when a queued task is written PENDING: a new one
(``enqueue``, ``enqueue_many``, ``ensure(queue=...)``), and one that comes back (a retry, a
release, a reservation given back, an operator's reset of a failed or cancelled task). The
notification is sent when the writing transaction commits, and never when it rolls back.

The ``WHEN`` clauses keep the hot path free: a claim, a heartbeat or a completion writes a
RUNNING or finished row, so the function is not even called. Identical notifications of one
transaction are sent once (PostgreSQL folds them): a bulk enqueue of one queue is one wake-up.
A task not due yet (``run_after`` in the future) is announced with ``due_in``, the seconds
until it is due, measured on the database clock when the row is written, so that a worker
can wake when it becomes due without trusting its own clock against the database's.

The payload is JSON (``{"queue": "default"}`` or ``{"queue": "default", "due_in": 1.5}``).
A notification is a hint that work may be there, never the hand-out: the worker still claims
with its one statement (``django_taskclaim/wakeups.py``). MySQL/MariaDB and SQLite have no
such thing: their workers poll (``TASKCLAIM_POLL_INTERVAL``).
"""

from django.db import migrations

TABLE = "django_taskclaim_task"
CHANNEL = "taskclaim_wakeup"  # django_taskclaim.store.listening.CHANNEL says the same
FUNCTION = "taskclaim_wakeup"
ON_INSERT = "taskclaim_task_wakeup_insert"
ON_UPDATE = "taskclaim_task_wakeup_update"

CREATE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    due_in double precision := extract(epoch FROM NEW.run_after - clock_timestamp());
BEGIN
    IF NEW.run_after IS NULL OR due_in <= 0 THEN
        PERFORM pg_notify('{CHANNEL}', json_build_object('queue', NEW.queue)::text);
    ELSE
        PERFORM pg_notify('{CHANNEL}', json_build_object('queue', NEW.queue, 'due_in', round(due_in::numeric, 3))::text);
    END IF;
    RETURN NULL;
END
$$
"""
# Only queued work (a NULL queue is a task claimed by key: no worker waits for it), only PENDING.
CLAIMABLE = "NEW.status = 'pending' AND NEW.queue IS NOT NULL"
# An update that leaves a pending task as it was (a coalesced enqueue replacing its arguments)
# announces nothing new; one that makes it pending, or moves its queue or its time, does.
CHANGED = ("OLD.status <> 'pending' OR OLD.queue IS DISTINCT FROM NEW.queue "
           "OR OLD.run_after IS DISTINCT FROM NEW.run_after")


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    q = schema_editor.quote_name
    schema_editor.execute(CREATE_FUNCTION)
    schema_editor.execute(f"DROP TRIGGER IF EXISTS {ON_INSERT} ON {q(TABLE)}")
    schema_editor.execute(f"CREATE TRIGGER {ON_INSERT} AFTER INSERT ON {q(TABLE)} FOR EACH ROW "
                          f"WHEN ({CLAIMABLE}) EXECUTE PROCEDURE {FUNCTION}()")
    schema_editor.execute(f"DROP TRIGGER IF EXISTS {ON_UPDATE} ON {q(TABLE)}")
    schema_editor.execute(f"CREATE TRIGGER {ON_UPDATE} AFTER UPDATE ON {q(TABLE)} FOR EACH ROW "
                          f"WHEN ({CLAIMABLE} AND ({CHANGED})) EXECUTE PROCEDURE {FUNCTION}()")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    q = schema_editor.quote_name
    schema_editor.execute(f"DROP TRIGGER IF EXISTS {ON_UPDATE} ON {q(TABLE)}")
    schema_editor.execute(f"DROP TRIGGER IF EXISTS {ON_INSERT} ON {q(TABLE)}")
    schema_editor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")


class Migration(migrations.Migration):
    dependencies = [("django_taskclaim", "0005_coalesce_group")]
    operations = [migrations.RunPython(create, drop)]
