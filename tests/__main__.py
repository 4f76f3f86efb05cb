"""The test command: ``python3 -m tests`` from a clone.

It creates ``.venv`` (first run, or when ``pyproject.toml`` changed) with the app and its test
dependencies, then runs pytest on SQLite, PostgreSQL and MariaDB. Without ``PGHOST`` (or
``MYSQL_TCP_PORT``) in the environment it starts a throwaway PostgreSQL (MariaDB) server on
127.0.0.1 for the run.

    python3 -m tests                      # SQLite, PostgreSQL and MariaDB
    python3 -m tests --db sqlite -k claim # one database, pytest options after
    python3 -m tests --config pool        # the core concurrency tests in one configuration
    python3 -m tests --config all         # ... in every configuration (tests/configurations.py)

A configuration other than ``default`` runs the core concurrency tests unless test paths are
given (and its own tests), on the databases it applies to; ``pgbouncer`` starts a PgBouncer in
front of PostgreSQL, ``sharded`` and ``sharded_mixed`` a second PostgreSQL server for the tenants
routed there.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Seconds one pytest run may take (``TASKCLAIM_TEST_RUN_DEADLINE``): the whole suite on one
#: database takes about ten minutes on a loaded 2-core machine; an hour is a run that hangs.
RUN_DEADLINE = float(os.environ.get("TASKCLAIM_TEST_RUN_DEADLINE", "3600"))


def run_with_deadline(argv: list[str], env: dict[str, str], what: str) -> int:
    """Run ``argv`` (a pytest run) to its end and return its exit code, or 124 once it has run
    ``RUN_DEADLINE`` seconds: then its threads' stacks are asked for (SIGUSR1, tests/conftest.py)
    and it is killed, so that the servers started for it are stopped and the next run starts; the
    message names what was waited for."""
    with subprocess.Popen(argv, cwd=ROOT, env=env) as proc:
        try:
            return proc.wait(RUN_DEADLINE)
        except subprocess.TimeoutExpired:
            print(f"\nERROR: {what} did not end within {RUN_DEADLINE:g} s (TASKCLAIM_TEST_RUN_DEADLINE); "
                  "its threads' stacks follow, then it is stopped", file=sys.stderr, flush=True)
            proc.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)  # the stacks are written meanwhile
            proc.kill()  # what it started dies with it or on its stdin's end; the servers go below
            proc.wait()
            return 124
        except BaseException:  # interrupted (SIGTERM, Ctrl-C): the run goes with the runner
            proc.kill()
            proc.wait()
            raise


def run_pytest(db: str, pytest_args: list[str], config: str = "default") -> int:
    from devtools.servers import MariaDBServer, PgBouncerServer, PostgresServer
    from tests.configurations import SHARD_SERVER

    env = dict(os.environ, TASKCLAIM_TEST_DB=db, TASKCLAIM_TEST_CONFIG=config, PYTHONPATH=str(ROOT))
    # A file of its own per run, so that two runs on one machine never share a database.
    sqlite_file = os.path.join(tempfile.gettempdir(), f"taskclaim-tests-{os.getpid()}-{config}.sqlite3")
    env.setdefault("TASKCLAIM_TEST_SQLITE", sqlite_file)
    server: PostgresServer | MariaDBServer | None = None
    bouncer = None
    if db == "postgresql" and "PGHOST" not in os.environ:
        server = PostgresServer().start()
        env.update(server.env)
        print(f"started PostgreSQL on 127.0.0.1:{server.port}", flush=True)
    if db == "mariadb" and "MYSQL_TCP_PORT" not in os.environ:
        server = MariaDBServer().start()
        env.update(server.env)
        print(f"started MariaDB on 127.0.0.1:{server.port}", flush=True)
    shard = None
    if config in SHARD_SERVER:
        # The second task database: a PostgreSQL server of its own, which the tests stop and start.
        shard = PostgresServer().start()
        env["TASKCLAIM_TEST_SHARD_SERVER"] = shard.description()
        print(f"started PostgreSQL (the second task database) on 127.0.0.1:{shard.port}", flush=True)
    if config == "pgbouncer" and db == "postgresql":
        bouncer = PgBouncerServer(int(env.get("PGPORT", "5432"))).start()
        env["TASKCLAIM_TEST_PGBOUNCER_PORT"] = str(bouncer.port)
        print(f"started PgBouncer (transaction pooling) on 127.0.0.1:{bouncer.port}", flush=True)
        # Keep the test database at the end: PgBouncer's idle server sessions would make
        # DROP DATABASE fail, and the throwaway server goes anyway.
        pytest_args = ["--reuse-db", *pytest_args]
    try:
        label = db if config == "default" else f"{db}, configuration {config}"
        print(f"\n===== tests on {label} =====", flush=True)
        return run_with_deadline([sys.executable, "-m", "pytest", *pytest_args], env, f"pytest on {label}")
    finally:
        if bouncer is not None:
            bouncer.stop()
        if shard is not None:
            shard.stop()
        if server is not None:
            server.stop()


def names_tests(pytest_args: list[str]) -> bool:
    """Whether the pytest arguments name test files or folders (else a configuration runs CORE)."""
    return any(not a.startswith("-") and (ROOT / a.split("::")[0]).exists() for a in pytest_args)


def main() -> int:
    from devtools.venv import ensure_venv

    # Stopped by SIGTERM (CI stopping its legs), end as on Ctrl-C: the servers started for the
    # run are stopped on the way out (run_pytest's finally), never left behind.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    ensure_venv()
    sys.path.insert(0, str(ROOT))
    from tests.configurations import CONFIGS, CORE, OWN

    parser = argparse.ArgumentParser(prog="python3 -m tests", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=("sqlite", "postgresql", "mariadb", "all"), default="all",
                        help="database(s) to run the suite on (default: %(default)s)")
    parser.add_argument("--config", choices=(*CONFIGS, "all"), default="default",
                        help="a configuration of tests/configurations.py (docs/configurations.md), or "
                             "'all' for every one but the default (default: %(default)s)")
    args, pytest_args = parser.parse_known_args()
    configs = [c for c in CONFIGS if c != "default"] if args.config == "all" else [args.config]
    dbs = ["sqlite", "postgresql", "mariadb"] if args.db == "all" else [args.db]
    runs = [(config, db) for config in configs for db in dbs if db in CONFIGS[config][0]]
    if not runs:
        parser.error(f"configuration {args.config!r} does not apply to {args.db}")
    results = {}
    for config, db in runs:
        selected = pytest_args if config == "default" or names_tests(pytest_args) else [
            *pytest_args, *CORE, *OWN.get(config, [])]
        label = db if config == "default" else f"{config}/{db}"
        results[label] = run_pytest(db, selected, config)
    print("\n" + "  ".join(f"{label}: {'ok' if code == 0 else f'FAILED (exit {code})'}"
                           for label, code in results.items()))
    return 0 if all(code == 0 for code in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
