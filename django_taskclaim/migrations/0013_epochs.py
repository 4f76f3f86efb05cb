"""Fencing tokens carry the store's epoch (DESIGN §13): the epoch's table and its one row, and on
PostgreSQL ``taskclaim_epoch_floor()``; the constraint that refuses a token past its epoch's last (django_taskclaim/store/epochs.py says what it computes).

Existing rows are not rewritten: each task's next claim lifts its token to the first of the current
epoch (``GREATEST``), in the claim's own statement. Rewriting them here would lock the whole task
table and fence off every running owner (its token would no longer match); a token only ever grows
either way, and the downstream's comparisons see a larger number on the next claim.
"""

from django.db import migrations, models
from django.db.models.expressions import F
from django.db.models.lookups import Exact

from django_taskclaim.compat import check_constraint

# The function's text as this migration wrote it (a later change of store/epochs.py is a migration).
FLOOR_FUNCTION = """
CREATE OR REPLACE FUNCTION taskclaim_epoch_floor() RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tl bigint := ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint;
BEGIN
    IF tl > 1048576 THEN
        RAISE EXCEPTION USING ERRCODE = 'numeric_value_out_of_range',
            MESSAGE = 'django_taskclaim: timeline ' || tl || ' is past the last epoch (timeline 1048576)';
    END IF;
    RETURN (tl - 1) * 8796093022208
        + COALESCE((SELECT e.bumps FROM django_taskclaim_epoch e WHERE e.id = 1 AND e.timeline = tl), 0)
        * 4294967296;
END
$$
"""

def first_row(apps, schema_editor):
    apps.get_model("django_taskclaim", "Epoch").objects.using(schema_editor.connection.alias).get_or_create(id=1)
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FLOOR_FUNCTION)


def drop_function(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS taskclaim_epoch_floor()")


WITHIN_EPOCH = check_constraint(
    condition=models.Q(fencing_token=0) | ~models.Q(Exact(F("fencing_token").bitand(4294967295), 0)),
    name="taskclaim_task_token_within_its_epoch")


def add_constraint(apps, schema_editor):
    # Not on SQLite: Django adds a constraint there by making the table anew, which would drop what
    # earlier migrations wrote in SQL (concurrency_key's default, the wake-up trigger). SQLite's claim
    # refuses a token past its epoch's last on its own (store/queries/sqlite.sql, next_token).
    if schema_editor.connection.vendor != "sqlite":
        schema_editor.add_constraint(apps.get_model("django_taskclaim", "Task"), WITHIN_EPOCH)


def remove_constraint(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        schema_editor.remove_constraint(apps.get_model("django_taskclaim", "Task"), WITHIN_EPOCH)


class Migration(migrations.Migration):
    dependencies = [("django_taskclaim", "0012_steps")]
    operations = [
        migrations.CreateModel(
            name="Epoch",
            fields=[
                ("id", models.SmallIntegerField(primary_key=True, serialize=False)),
                ("timeline", models.BigIntegerField(default=0, verbose_name="timeline")),
                ("bumps", models.BigIntegerField(default=0, verbose_name="bumps")),
                ("bumped_at", models.DateTimeField(blank=True, null=True, verbose_name="bumped at")),
            ],
            options={"verbose_name": "epoch", "verbose_name_plural": "epochs"},
        ),
        migrations.RunPython(first_row, drop_function),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddConstraint(model_name="task", constraint=WITHIN_EPOCH)],
            database_operations=[migrations.RunPython(add_constraint, remove_constraint)],
        ),
    ]
