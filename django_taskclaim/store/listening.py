"""Hearing that work may be there: ``LISTEN`` on a task database's wake-up channel (PostgreSQL).

Migration 0005 adds the triggers that ``NOTIFY`` the channel when a queued task becomes PENDING.
A :class:`Listener` is a psycopg connection of its own, outside Django's connection handling:
a session that ``LISTEN``\\s must stay the same session, which Django's pool (a connection
handed back between queries) and a transaction-mode pooler (PgBouncer's ``pool_mode =
transaction``: any server session per transaction) do not promise. The other databases have no
such channel: :func:`can_listen` says no, and their workers poll.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import OperationalError, connections

#: The channel migration 0006's trigger function notifies (its payload: JSON with the queue,
#: and ``due_in`` seconds for a task not due yet).
CHANNEL = "taskclaim_wakeup"
#: What a listener's session is called in ``pg_stat_activity`` (unless OPTIONS name one).
APPLICATION_NAME = "taskclaim wakeups"


def can_listen(alias: str) -> bool:
    """Whether task database ``alias`` can wake its workers: PostgreSQL through psycopg 3, not
    set up for a transaction-mode pooler (``DISABLE_SERVER_SIDE_CURSORS = True`` is Django's sign
    of one, as for check E010), where a ``LISTEN`` would be lost with its server session."""
    db = connections[alias]
    if db.vendor != "postgresql" or db.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        return False
    try:
        import psycopg  # noqa: F401  (psycopg2 has no notifies() with a timeout)
    except ImportError:
        return False
    return True


def parse(payload: str) -> tuple[str, float | None] | None:
    """A notification's ``(queue, due_in)`` (``due_in``: None when due now); None for a payload
    that is not one of the trigger's."""
    try:
        found = json.loads(payload)
        queue, due_in = found["queue"], found.get("due_in")
        return str(queue), None if due_in is None else float(due_in)
    except (ValueError, TypeError, KeyError):
        return None


class Listener:
    """One ``LISTEN``\\ing session on task database ``alias``. A lost connection raises Django's
    ``OperationalError`` (from psycopg's), for the caller to open a new one."""

    def __init__(self, alias: str) -> None:
        import psycopg

        params: dict[str, Any] = connections[alias].get_connection_params()
        # Django's cursor class, type adapters and prepare threshold are for its own queries.
        for name in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(name, None)
        params.setdefault("application_name", APPLICATION_NAME)
        self.alias = alias
        try:
            self.connection = psycopg.connect(**params, autocommit=True)
            self.connection.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as exc:
            raise OperationalError(f"cannot listen on database {alias!r}: {exc}") from exc

    def receive(self, timeout: float) -> list[str]:
        """The payloads that arrived, waiting up to ``timeout`` seconds for the first (0: only
        those already there)."""
        import psycopg

        try:
            got = [n.payload for n in self.connection.notifies(timeout=timeout, stop_after=1)]
            if got:  # and whatever came with it or since, without waiting
                got += [n.payload for n in self.connection.notifies(timeout=0)]
        except psycopg.Error as exc:
            raise OperationalError(f"the wake-ups of database {self.alias!r} were lost: {exc}") from exc
        return got

    def close(self) -> None:
        self.connection.close()
