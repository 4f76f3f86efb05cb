"""The test command: ``python3 -m tests`` from a clone.

It creates ``.venv`` (first run, or when ``pyproject.toml`` changed) with the app and its test
dependencies, then runs pytest on SQLite, PostgreSQL and MariaDB. Without ``PGHOST`` (or
``MYSQL_TCP_PORT``) in the environment it starts a throwaway PostgreSQL (MariaDB) server on
127.0.0.1 for the run.

    python3 -m tests                      # SQLite, PostgreSQL and MariaDB, side by side
    python3 -m tests --db sqlite -k claim # one database, pytest options after
    python3 -m tests --config pool        # the core concurrency tests in one configuration
    python3 -m tests --config all         # ... in every configuration (tests/configurations.py)

Without ``--db``, the three databases run side by side, as CI's legs do (.ci/run): each a
``python3 -m tests --db X`` of its own, with its own servers and test databases, its output in
``artifacts/tests/X.log``, printed whole in order once all have ended, then each one's time; a
failing database fails the command, and SIGTERM or Ctrl-C stops all of them and their servers.
The whole suite runs every test at least once across them, as CI's database legs do:
``tests/repository`` in the PostgreSQL run only (its benchmark runs need PostgreSQL), the admin in
Chromium (``tests/operators/test_browser.py``) and the Celery tests on RabbitMQ in the MariaDB run
only (the shortest); test paths named on the command line run on all three.

A configuration other than ``default`` runs the core concurrency tests unless test paths are
given (and its own tests), on the databases it applies to; ``pgbouncer`` starts a PgBouncer in
front of PostgreSQL, ``sharded`` and ``sharded_mixed`` a second PostgreSQL server for the tenants
routed there.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
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


#: Where each database's run writes its output when the databases run side by side
#: (``TASKCLAIM_TEST_LOGS``: the runner's own tests, inside a run, write theirs elsewhere).
LOGS = Path(os.environ.get("TASKCLAIM_TEST_LOGS", ROOT / "artifacts" / "tests"))
DATABASES = ("sqlite", "postgresql", "mariadb")
#: What the whole suite runs in one database's run only (CI's legs leave out the same): the
#: repository's own checks need no database under test but PostgreSQL for the benchmarks' smoke
#: runs; the admin in Chromium depends on Django's version, not on the database; RabbitMQ goes to
#: the shortest run (the Celery tests run on Redis in all three).
ONLY_IN = {"tests/repository": "postgresql", "tests/operators/test_browser.py": "mariadb"}
BROKERS = {"postgresql": "redis", "mariadb": "redis,rabbitmq", "sqlite": "redis"}
#: Seconds a database's run has, once asked to stop (SIGTERM), to stop its pytest and its servers.
STOP_GRACE = 60.0


def leg_command(db: str, pytest_args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command and environment of ``db``'s run among the three side by side: the test command
    on that database, with the whole suite's leave-outs (``ONLY_IN``) unless tests are named."""
    env = dict(os.environ)
    args = list(pytest_args)
    if not names_tests(pytest_args):
        args = [f"--ignore={path}" for path, only in ONLY_IN.items() if only != db] + args
        env.setdefault("TASKCLAIM_TEST_BROKERS", BROKERS[db])
    # A test database of its own name on a server of the reader's (MYSQL_TCP_PORT), which also
    # names the files beside it (LangGraph's checkpoints in the temporary folder): two runs of
    # this command on one machine never share them. PostgreSQL's and SQLite's are per server
    # and per runner process already.
    if db == "mariadb":
        env.setdefault("TASKCLAIM_TEST_MYSQL_NAME", f"test_taskclaim_{os.getpid()}")
    return [sys.executable, "-m", "tests", "--db", db, *args], env


def run_side_by_side(pytest_args: list[str], dbs: tuple[str, ...] = DATABASES) -> int:
    """Run the suite on ``dbs`` at once, each run a process of its own writing to its log under
    ``artifacts/tests/``; print the logs whole in order, then each run's time. 0 when every run
    passed, else 1. Interrupted (SIGTERM, Ctrl-C), every run still going is sent SIGTERM, which
    stops its pytest and its servers (run_pytest), and is killed with its process group after
    ``STOP_GRACE`` seconds."""
    LOGS.mkdir(parents=True, exist_ok=True)
    ended: queue.Queue[tuple[str, int, float]] = queue.Queue()
    runs: dict[str, subprocess.Popen[bytes]] = {}
    results: dict[str, tuple[int, float]] = {}

    def wait_for(db: str, proc: subprocess.Popen[bytes], start: float) -> None:
        ended.put((db, proc.wait(), time.monotonic() - start))

    started = time.monotonic()
    try:
        for db in dbs:
            argv, env = leg_command(db, pytest_args)
            with open(LOGS / f"{db}.log", "wb") as log:
                # A session of its own: Ctrl-C in a terminal reaches this runner only, which
                # stops each run in order (below) rather than all at once mid-start.
                proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            runs[db] = proc
            threading.Thread(target=wait_for, args=(db, proc, time.monotonic()), daemon=True).start()
            print(f"started the tests on {db} (pid {proc.pid}): output in {LOGS / db}.log",
                  flush=True)
        while len(results) < len(runs):
            db, code, took = ended.get()
            results[db] = (code, took)
            print(f"   tests on {db} ended after {took:.0f} s: {'ok' if code == 0 else f'FAILED (exit {code})'}",
                  flush=True)
    except KeyboardInterrupt:  # Ctrl-C: the runs are stopped below; their logs say how far they got
        print(f"\ninterrupted: the logs so far are in {LOGS}/", file=sys.stderr, flush=True)
        return 130
    finally:
        stop_runs({db: proc for db, proc in runs.items() if proc.poll() is None})
    for db in dbs:
        print(f"\n======== {db}: {describe(*results[db])} ========", flush=True)
        sys.stdout.buffer.write((LOGS / f"{db}.log").read_bytes())
        sys.stdout.flush()
    print("\n" + "  ".join(f"{db}: {describe(*results[db])}" for db in dbs)
          + f"  (side by side: {time.monotonic() - started:.0f} s)", flush=True)
    return 0 if all(code == 0 for code, _ in results.values()) else 1


def describe(code: int, took: float) -> str:
    return f"{'ok' if code == 0 else f'FAILED (exit {code})'} in {took:.0f} s"


def stop_runs(running: dict[str, subprocess.Popen[bytes]]) -> None:
    """Stop the runs still going: SIGTERM to each (its runner stops its pytest and servers), then,
    after ``STOP_GRACE`` seconds, SIGKILL to the process group of any still there."""
    if not running:
        return
    print(f"\nstopping the tests on {', '.join(running)} ...", file=sys.stderr, flush=True)
    for proc in running.values():
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    for db, proc in running.items():
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"the tests on {db} did not stop within {STOP_GRACE:g} s: killed", file=sys.stderr, flush=True)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


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
    if args.db == "all" and configs == ["default"]:
        return run_side_by_side(pytest_args)
    results = {}
    for config, db in runs:
        selected = pytest_args if config == "default" or names_tests(pytest_args) else [
            *pytest_args, *CORE, *OWN.get(config, [])]
        label = db if config == "default" else f"{config}/{db}"
        start = time.monotonic()
        code = run_pytest(db, selected, config)
        results[label] = (code, time.monotonic() - start)
    print("\n" + "  ".join(f"{label}: {describe(*result)}" for label, result in results.items()))
    return 0 if all(code == 0 for code, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
