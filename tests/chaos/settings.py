"""Settings of the harness's processes: the test settings plus a name on each PostgreSQL session.

The nemesis finds a worker's server process through ``application_name`` in
``pg_stat_activity`` (``CHAOS_APP_NAME``), to terminate it or to catch it inside a commit.
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, DB_VENDOR

if DB_VENDOR == "postgresql":
    DATABASES["default"]["OPTIONS"] = {
        "application_name": os.environ.get("CHAOS_APP_NAME", "chaos"),
        # A restarting server refuses connections for a moment; fail fast and retry instead.
        "connect_timeout": 5,
    }
