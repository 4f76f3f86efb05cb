"""Test settings for processes started by the operator tests (``tests/processes/test_ops_races.py``,
``tests/operators/test_ops_second_db.py``).

The suite's settings, plus what a few tests vary through the environment:

- ``TASKCLAIM_TEST_SQLITE_TIMEOUT``: the SQLite busy timeout (``OPTIONS["timeout"]``), to run
  workers with the value the docs recommend instead of the suite's generous one.
- ``TASKCLAIM_TEST_TASKS_DB``: a second database alias, ``tasks``, holding the task table
  (``TASKCLAIM_DATABASE = "tasks"``): a SQLite file name, or a PostgreSQL database name on the
  suite's server.
"""

import copy
import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, DB_VENDOR

if DB_VENDOR == "sqlite" and os.environ.get("TASKCLAIM_TEST_SQLITE_TIMEOUT"):
    DATABASES["default"]["OPTIONS"] = {"timeout": float(os.environ["TASKCLAIM_TEST_SQLITE_TIMEOUT"])}

if os.environ.get("TASKCLAIM_TEST_TASKS_DB"):
    DATABASES["tasks"] = copy.deepcopy(DATABASES["default"])
    DATABASES["tasks"]["NAME"] = os.environ["TASKCLAIM_TEST_TASKS_DB"]
    TASKCLAIM_DATABASE = "tasks"
