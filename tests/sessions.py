"""Ending a database session from outside, as a server restart or a pooler would (PostgreSQL's
``pg_terminate_backend``, MariaDB's ``KILL CONNECTION``): shared by the tests of what survives it."""

from __future__ import annotations

import threading

from django.db import connection


def kill_session_of(alias_connection) -> None:  # type: ignore[no-untyped-def]
    """Terminate the database session ``alias_connection`` holds, from another connection."""
    from django.db import connections

    if connection.vendor == "postgresql":
        pid = alias_connection.connection.info.backend_pid
        sql, params = "SELECT pg_terminate_backend(%s)", [pid]
    else:
        with alias_connection.cursor() as cursor:
            cursor.execute("SELECT CONNECTION_ID()")
            pid = cursor.fetchone()[0]
        sql, params = "KILL CONNECTION %s", [pid]

    def kill() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute(sql, params)
        finally:
            connections["default"].close()

    killer = threading.Thread(target=kill)
    killer.start()
    killer.join(30)
