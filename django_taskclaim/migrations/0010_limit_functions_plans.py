"""PostgreSQL only: the two functions of concurrency limits (migration 0008) keep their plans.

``taskclaim_room()`` was a SQL function: PostgreSQL plans a SQL function's body again in every
statement that calls it (it caches the plan for one statement only), so each queue claim that met a
limited task planned it anew. It is now plpgsql, whose plans last the session. ``taskclaim_fit()``
ran its statements on custom plans, which the plan cache chose after its first five calls (their
estimated cost was lower) and so planned all three again on every call; it now uses the generic plan
(``plan_cache_mode``), the one the prepared claim statement itself uses. Measured on the loaded
machine: a call of ``taskclaim_fit()`` for a limited task 1.4–3 ms → 0.07–0.9 ms. Same arguments,
same results; the functions' texts are 0008's otherwise.
"""

from importlib import import_module

from django.db import migrations

ROOM = """
CREATE OR REPLACE FUNCTION taskclaim_room(task bigint, finishing bigint) RETURNS boolean
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN (SELECT (SELECT count(*) FROM django_taskclaim_task r WHERE r.concurrency_key = t.concurrency_key
                    AND r.status = 'running' AND r.id IS DISTINCT FROM finishing) < t.concurrency_limit
            FROM django_taskclaim_task t WHERE t.id = task);
END
$$
"""
FIT_GENERIC = "ALTER FUNCTION taskclaim_fit(bigint[], bigint) SET plan_cache_mode = force_generic_plan"
FIT_AS_BEFORE = "ALTER FUNCTION taskclaim_fit(bigint[], bigint) RESET plan_cache_mode"


def keep_plans(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ROOM)  # (CREATE OR REPLACE may change a function's language)
        schema_editor.execute(FIT_GENERIC)


def as_before(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        previous = import_module("django_taskclaim.migrations.0008_concurrency_limits")
        schema_editor.execute(previous.ROOM)
        schema_editor.execute(FIT_AS_BEFORE)


class Migration(migrations.Migration):
    dependencies = [("django_taskclaim", "0009_mysql_claim_order_index")]
    operations = [migrations.RunPython(keep_plans, as_before)]
