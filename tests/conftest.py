"""Fixtures shared by the suite: worker processes that talk to the test database."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from django.db import connection, connections

from devtools import stacks
from devtools.processes import Child, Supervisor
from devtools.servers import PostgresServer

ROOT = Path(__file__).resolve().parent.parent


def requirement_missing(what: str) -> None:
    """Skip locally when a server binary is missing; fail in CI, where everything must run."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} is required in CI")
    pytest.skip(f"{what} is not installed", allow_module_level=True)  # usable at import time too


def require_module(module: str, what: str) -> None:
    """Import ``module`` or report ``what`` missing: a skip locally, a failure in CI."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        requirement_missing(what)


@pytest.fixture
def worker_env() -> dict[str, str]:
    """Environment for a child process that should use the test database."""
    return child_env()


def child_env() -> dict[str, str]:
    """This process's environment, with the test databases' names for a child to connect to them."""
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="tests.settings",
        TASKCLAIM_TEST_DB_NAME=str(connection.settings_dict["NAME"]),
        PYTHONPATH=str(ROOT),
    )
    if "tasks" in connections:  # the second_db configuration
        env["TASKCLAIM_TEST_TASKS_DB_NAME"] = str(connections["tasks"].settings_dict["NAME"])
    if "shard2" in connections:  # the sharded configurations
        env["TASKCLAIM_TEST_SHARD_DB_NAME"] = str(connections["shard2"].settings_dict["NAME"])
    return env


#: Seconds pytest waits at its end for threads a test left running, before it names them and exits.
THREADS_AT_EXIT = float(os.environ.get("TASKCLAIM_TEST_THREADS_AT_EXIT", "60"))
_STDERR = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    """Every thread's stack on SIGUSR1 (the runner's deadline, tests/__main__.py) and on SIGTERM, to
    this process's stderr (a copy of it made now: a test's output is captured elsewhere)."""
    config.stash[_STDERR] = os.dup(sys.stderr.fileno())
    stacks.dump_on_signals(config.stash[_STDERR])


@pytest.hookimpl(trylast=True)  # after the other plugins' ends: the reports are written
def pytest_unconfigure(config: pytest.Config) -> None:
    """pytest never waits for ever at its end: the interpreter waits at exit for every non-daemon
    thread (a worker's lanes a test started and never stopped); still running after
    ``THREADS_AT_EXIT`` seconds, they are named with their stacks and the process exits with 1."""
    left = stacks.threads_left(THREADS_AT_EXIT)
    if not left:
        return
    sys.stdout.flush()
    report = (f"\npytest would wait for ever at exit for {len(left)} thread(s) a test left running "
              f"(still running {THREADS_AT_EXIT:g} s after the last test); their stacks:\n{stacks.stacks(left)}")
    os.write(config.stash.get(_STDERR, 2), report.encode(errors="replace"))
    os._exit(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """With a second database (the second_db configuration), database tests may use both."""
    from django.conf import settings

    if len(settings.DATABASES) < 2:
        return
    for item in items:
        marker = item.get_closest_marker("django_db")
        if marker is not None and "databases" not in marker.kwargs:
            item.add_marker(pytest.mark.django_db(*marker.args, **marker.kwargs, databases="__all__"), append=False)


@pytest.fixture(autouse=True)
def _no_listener_left() -> Iterator[None]:
    """A ``work()`` run in the test's thread may leave a listening session (wake-ups, PostgreSQL):
    closed after each test, so that none holds the test database at its end."""
    yield
    from django_taskclaim import wakeups

    wakeups.close()


@pytest.fixture
def processes(worker_env: dict[str, str]) -> Iterator[Supervisor]:
    """Child processes on the test database (``devtools.processes``); any still running at the end are killed."""
    with Supervisor(env=worker_env, cwd=ROOT) as supervisor:
        yield supervisor


@pytest.fixture(scope="module")
def command_line(django_db_setup: None) -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    """``command_line(*ARGS)``: ``python -m django ARGS`` on the test database, in a process of its
    own forked from one that set Django up once for the module (tests/programs/command_lines.py),
    its exit code, stdout and stderr as ``subprocess.run`` gives them."""
    with Supervisor(env=child_env(), cwd=ROOT) as supervisor:
        forks = supervisor.start("tests.programs.command_lines")
        forks.event("ready", timeout=120)

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            assert forks.send(json.dumps(args)), forks.stderr()
            done = forks.event("done", timeout=120)
            return subprocess.CompletedProcess(["python", "-m", "django", *args], done["returncode"],
                                               done["stdout"], done["stderr"])

        yield run
        forks.end_input()
        forks.finish(60)


@pytest.fixture
def spawn(processes: Supervisor) -> Callable[..., Child]:
    """Start ``python -m tests.programs.claimer ARGS`` children of ``processes`` (``env=`` adds to theirs)."""
    return partial(processes.start, "tests.programs.claimer")


@pytest.fixture
def shard_server() -> Iterator[PostgresServer]:
    """The second task database's server of the sharded configurations (started by the test
    runner), to stop, start and freeze; continued and started again if a test left it so.

    Told apart by the server's processes, never by connecting: a connection to a server left
    frozen (SIGSTOP) waits for ever, and so would every later test's.
    """
    described = os.environ.get("TASKCLAIM_TEST_SHARD_SERVER")
    if not described:
        pytest.skip("the runner did not start the second server (python3 -m tests --config sharded)")
    server = PostgresServer.attached(described)
    yield server
    server.thaw_all()
    connections["shard2"].close()
    if not server.running():
        server.resume()


def db_now() -> dt.datetime:
    """The database clock, read in SQL (exactly the expression the app compares leases with)."""
    from django_taskclaim.store import get_store

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {get_store('default').now}", [])  # params: the SQL has %% escapes
        return get_store("default").to_datetime(cursor.fetchone()[0])  # type: ignore[return-value]


def lease_left(key: str) -> float:
    """Seconds from the database clock to the task's lease expiry, both read in one statement.

    Both values come back as datetimes and are subtracted exactly in Python (no float
    ``julianday`` arithmetic), so the result is exact to the microsecond.
    """
    from django_taskclaim.store import get_store

    store = get_store("default")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT lease_expires_at, {store.now} FROM django_taskclaim_task "  # noqa: S608 (the clock)
                       f"WHERE {connection.ops.quote_name('key')} = %s", [key])
        expires, now = cursor.fetchone()
    return (store.to_datetime(expires) - store.to_datetime(now)).total_seconds()  # type: ignore[operator]


def expire(task_or_pk) -> None:  # type: ignore[no-untyped-def]
    """Move a running task's lease into the past, as if its owner stopped heartbeating long ago."""
    from django_taskclaim.models import Task

    pk = getattr(task_or_pk, "pk", getattr(task_or_pk, "task_id", task_or_pk))
    Task.objects.filter(pk=pk).update(lease_expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))


# MySQL/MariaDB: how many other sessions have a statement on the task table waiting ("updating"
# for an UPDATE, "update" for an INSERT; "sending data" or "executing", as MariaDB's versions name it,
# for either when it reads the epoch's row in a subquery: InnoDB's information_schema.innodb_trx did
# not list the waiting transaction from inside ours).
MYSQL_LOCK_WAITS = ("SELECT count(*) FROM information_schema.processlist WHERE id <> CONNECTION_ID() "
                    "AND (LOWER(state) IN ('updating', 'update') OR (LOWER(state) IN ('sending data', 'executing') "
                    "AND (info LIKE 'INSERT%%' OR info LIKE 'UPDATE%%'))) AND info LIKE '%%django_taskclaim_task%%'")
