"""MySQL/MariaDB only: every text column of the task and attempt tables stores any Unicode.

A database created with another character set (``latin1``, or ``utf8``/``utf8mb3``, which holds
no 4-byte characters such as emoji) gives the tables' text columns that set: migration 0002
converted only ``tenant`` and ``key``. Strict mode then refuses an owner, an error, a delivery
id… with such characters (error 1366: a ``fail()`` that never lands, the task left RUNNING);
otherwise they are stored as ``?``, and a worker named ``worker-🙂`` no longer recognises its
own claims. Each text column that is not utf8mb4 becomes utf8mb4, with utf8mb4's default
collation (``tenant`` and ``key``, already utf8mb4, keep 0002's binary collation), keeping its
type, nullability and column check (MariaDB stores JSON as ``LONGTEXT`` with a ``json_valid``
check); the tables' default character set becomes utf8mb4 for columns added later.

Nothing to do on PostgreSQL and SQLite, nor for columns already utf8mb4. Not reversed: a
narrower character set could lose what was stored since.
"""

from django.db import migrations

TABLES = ("django_taskclaim_task", "django_taskclaim_attempt")


def _narrow_columns(cursor, table: str) -> list[tuple[str, str, bool]]:
    """``(column, type, nullable)`` of each text column of ``table`` that is not utf8mb4."""
    cursor.execute(
        "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND CHARACTER_SET_NAME IS NOT NULL "
        "AND CHARACTER_SET_NAME <> 'utf8mb4' ORDER BY ORDINAL_POSITION",
        [table],
    )
    return [(name, kind, nullable == "YES") for name, kind, nullable in cursor.fetchall()]


def _column_checks(cursor, connection, table: str) -> dict[str, str]:
    """MariaDB's column-level checks (part of the column's definition, which MODIFY restates)."""
    if not connection.mysql_is_mariadb:
        return {}  # MySQL keeps every check at table level: MODIFY leaves them alone
    cursor.execute(
        "SELECT CONSTRAINT_NAME, CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS "
        "WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME = %s AND LEVEL = 'Column'",
        [table],
    )
    return dict(cursor.fetchall())


def to_utf8mb4(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    q = schema_editor.quote_name
    with connection.cursor() as cursor:
        # The database's own utf8mb4 collation where it has one: the server's default collation
        # for utf8mb4 may differ, and comparing columns of two collations of one character set
        # (a join with another app's table) fails with "Illegal mix of collations".
        cursor.execute("SELECT @@collation_database")
        [database_collation] = cursor.fetchone()
        collate = f" COLLATE {database_collation}" if str(database_collation).startswith("utf8mb4_") else ""
        for table in TABLES:
            narrow = _narrow_columns(cursor, table)
            if not narrow:
                continue
            checks = _column_checks(cursor, connection, table)
            changes = [
                f"MODIFY {q(name)} {kind} CHARACTER SET utf8mb4{collate} {'NULL' if nullable else 'NOT NULL'}"
                + (f" CHECK ({checks[name]})" if name in checks else "")
                for name, kind, nullable in narrow
            ]
            schema_editor.execute(f"ALTER TABLE {q(table)} DEFAULT CHARACTER SET utf8mb4, {', '.join(changes)}")


class Migration(migrations.Migration):
    dependencies = [("django_taskclaim", "0002_mysql_status_index")]
    operations = [migrations.RunPython(to_utf8mb4, migrations.RunPython.noop, atomic=False)]
