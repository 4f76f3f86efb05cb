"""The configuration matrix: supported Django setups the core concurrency tests run in.

Standard library only (the test runner reads it before the virtualenv exists). Each name is a
value of ``TASKCLAIM_TEST_CONFIG``, which ``tests/settings.py`` turns into settings and the
worker processes (``tests/programs/claimer.py``) into caller behaviour; docs/configurations.md says what
each one means for users.
"""

from __future__ import annotations

# name -> (databases it applies to, what it is)
CONFIGS: dict[str, tuple[tuple[str, ...], str]] = {
    "default": (("sqlite", "postgresql", "mariadb"), "the plain settings of tests/settings.py"),
    "pool": (("postgresql",), "Django's connection pool (OPTIONS 'pool', psycopg-pool)"),
    "server_side_binding": (("postgresql",), "OPTIONS 'server_side_binding': True"),
    "pgbouncer": (("postgresql",), "a real PgBouncer in transaction pool mode, TASKCLAIM_PREPARED_STATEMENTS False"),
    "atomic_requests": (("sqlite", "postgresql"), "ATOMIC_REQUESTS = True, views raced by processes"),
    "second_db": (("sqlite", "postgresql"), "TASKCLAIM_DATABASE = 'tasks', a second alias with a router"),
    "autocommit_off": (("sqlite", "postgresql"), "workers call transaction.set_autocommit(False) and commit"),
    "sharded": (("postgresql",), "tenants routed over two PostgreSQL servers (TASKCLAIM_ROUTER, a second server)"),
    "sharded_mixed": (("sqlite",), "tenants routed over SQLite (default) and a PostgreSQL server"),
}

#: Configurations whose second database is a PostgreSQL server of its own, started by the runner
#: (``TASKCLAIM_TEST_SHARD_SERVER`` describes it to the tests, which stop and start it).
SHARD_SERVER = ("sharded", "sharded_mixed")

# What runs in each configuration unless test paths are given: races between real processes
# (one winner; a drain where every effect lands once; pauses past the lease and kills), and
# the configuration's own tests.
CORE = ["tests/processes/test_concurrency.py", "tests/databases/test_configurations.py"]
# And in some configurations, tests of their own.
OWN: dict[str, list[str]] = {
    config: ["tests/databases/test_sharded.py", "tests/processes/test_sharded_processes.py",
             "tests/operators/test_database_down.py"] for config in SHARD_SERVER
}
