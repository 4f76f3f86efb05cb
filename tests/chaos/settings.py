"""Settings of the harness's processes: the test settings plus a name on each PostgreSQL session.

The nemesis finds a worker's server process through ``application_name`` in
``pg_stat_activity``, to terminate it or to catch it inside a commit: each process's own, in
libpq's ``PGAPPNAME`` (read when it connects, so that the harness's processes differ only in a
variable the fork server of ``devtools/forkserver.py`` sets after the fork).

With the ``failover`` fault, ``HOST`` and ``PORT`` list both servers of the pair
(``"127.0.0.1,127.0.0.1"``, ``"5433,5434"``: Django hands them to libpq as they are) and
``OPTIONS`` adds ``target_session_attrs = "read-write"``, so that every connection, first or
after a failover, goes to whichever server is the primary.

With ``--schedules`` the schedule comes in ``CHAOS_SCHEDULES`` (JSON, tests/chaos/ticks.py), and the
default attempts are the harness's own tasks' (100,000): a tick taken over again and again under
the nemesis must not end FAILED for running out of attempts.
"""

import json
import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, DB_VENDOR

if DB_VENDOR == "postgresql":
    _options: dict[str, object] = {
        # A restarting server refuses connections for a moment; fail fast and retry instead.
        "connect_timeout": 5,
    }
    if os.environ.get("CHAOS_TARGET_SESSION_ATTRS"):
        _options["target_session_attrs"] = os.environ["CHAOS_TARGET_SESSION_ATTRS"]
    DATABASES["default"]["OPTIONS"] = _options

if os.environ.get("CHAOS_SCHEDULES"):
    TASKCLAIM_SCHEDULES = json.loads(os.environ["CHAOS_SCHEDULES"])
    TASKCLAIM_MAX_ATTEMPTS = 100_000
