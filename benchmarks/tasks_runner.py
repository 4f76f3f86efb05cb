"""One step of the Django Tasks phase, in a child process under a system's own interpreter.

    python -m benchmarks.tasks_runner SYSTEM setup
    python -m benchmarks.tasks_runner SYSTEM prepare N [KIND [ARGS [HOW]]]  # empty the tables, enqueue N, analyse
    python -m benchmarks.tasks_runner SYSTEM enqueue N KIND [ARGS [HOW]]    # enqueue N more, nothing emptied
    python -m benchmarks.tasks_runner SYSTEM bulk N HOW       # empty the tables, time N enqueues
    python -m benchmarks.tasks_runner SYSTEM worker COMMAND [ARG ...]
    python -m benchmarks.tasks_runner SYSTEM count
    python -m benchmarks.tasks_runner SYSTEM latency N        # N tasks one at a time to an idle worker
    python -m benchmarks.tasks_runner SYSTEM accepts COMMAND OPTION ...  # which options COMMAND takes

SYSTEM is a key of ``benchmarks.tasks_systems.SYSTEMS``; ``TASKCLAIM_BENCH_URL`` names the
database. Each step prints one ``@@result`` line of JSON; a worker first prints ``@@ready`` and
waits for a line on its standard input (the driver's start signal, sent to all workers at once).
KIND names a task of ``benchmarks.io_tasks.KINDS`` (default ``noop``), ARGS a JSON list of the
arguments it takes after the task's index, HOW ``loop`` (``Task.enqueue()``, the default) or the
system's bulk call (``benchmarks.tasks_systems.bulk_enqueue``).
Needs only the standard library, Django and the system, so it runs in the peers' virtualenvs.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any

READY, RESULT = "@@ready", "@@result "


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def setup(system: str) -> dict[str, Any]:
    """Can this interpreter run the system? If so, migrate its tables; its versions either way."""
    import importlib.util
    import platform

    from benchmarks.tasks_systems import OURS, SYSTEMS

    found: dict[str, Any] = {"python": platform.python_version()}
    # django-taskclaim is found from the checkout in every process: it is only ours to report.
    for dist in ("Django", "django-tasks", "django-tasks-db", "django-ox", "psycopg") + (
            ("django-taskclaim",) if system == OURS else ()):
        with contextlib.suppress(PackageNotFoundError):
            found[dist] = version(dist)
    backend = SYSTEMS[system].backend
    if system == OURS and importlib.util.find_spec(backend.rpartition(".")[0]) is None:
        return {**found, "error": f"{backend.rpartition('.')[0]} cannot be imported (no such module)"}
    try:
        import django
        from django.core.management import call_command
        from django.utils.module_loading import import_string

        django.setup()
        import_string(backend)
        import benchmarks.dtdb_tasks  # noqa: F401  (the task, built by the backend's task_class)

        call_command("migrate", verbosity=0)
    except Exception as exc:
        return {**found, "error": f"{type(exc).__name__}: {exc}"}
    return found


def truncate(system: str) -> list[str]:
    from django.db import connection

    from benchmarks.tasks_systems import tables

    names = tables(system)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE " + ", ".join(connection.ops.quote_name(t) for t in names) + " CASCADE")
    return names


def prepare(system: str, count: int, kind: str = "noop", args: str = "[]", how: str = "loop") -> dict[str, Any]:
    """Empty the system's tables, enqueue ``count`` tasks of ``kind`` (no-op ones by default)
    through ``Task.enqueue()`` or the system's bulk call (``how``: one transaction, for speed: the
    drain is what is measured), then ``VACUUM ANALYZE``."""
    from django.db import connection

    names = truncate(system)
    enqueue(system, count, kind, args, how)
    with connection.cursor() as cursor:
        for name in names:
            cursor.execute(f"VACUUM ANALYZE {connection.ops.quote_name(name)}")
    return {"enqueued": count}


def enqueue(system: str, count: int, kind: str, args: str = "[]", how: str = "loop") -> dict[str, Any]:
    """Enqueue ``count`` tasks of ``kind``, task ``i`` called with ``i`` and the JSON list ``args``,
    in one transaction, the way ``how`` says (``benchmarks.tasks_systems.bulk_enqueue``)."""
    from django.db import transaction

    from benchmarks.tasks_systems import bulk_enqueue

    if kind.startswith("limited"):  # ours only: django_taskclaim's claim_options
        from benchmarks.limited_tasks import KINDS
    else:
        from benchmarks.io_tasks import KINDS
    with transaction.atomic():
        bulk_enqueue(system, how, KINDS[kind], count, tuple(json.loads(args)))
    return {"enqueued": count}


def bulk(system: str, count: int, how: str) -> dict[str, Any]:
    """Time ``count`` enqueues in one transaction, from its start to its commit."""
    from django.db import connection, transaction

    from benchmarks.dtdb_tasks import noop
    from benchmarks.tasks_systems import bulk_enqueue

    truncate(system)
    connection.ensure_connection()
    with transaction.atomic():  # one enqueue, rolled back: code paths and statements warm
        bulk_enqueue(system, how, noop, 1)
        transaction.set_rollback(True)
    start = time.perf_counter()
    with transaction.atomic():
        bulk_enqueue(system, how, noop, count)
    seconds = time.perf_counter() - start
    return {"seconds": seconds}


def worker(command: str, args: list[str]) -> dict[str, Any]:
    """The system's own worker command, as ``manage.py COMMAND ARGS`` runs it, timed from the start
    signal to its return; the task ids (arguments) it executed."""
    from django.core.management import call_command, get_commands, load_command_class
    from django.db import connection

    import benchmarks.io_tasks  # noqa: F401  (the I/O phase's tasks, imported before the start)
    from benchmarks.dtdb_tasks import EXECUTED

    load_command_class(get_commands()[command], command)  # its module imported before the start
    connection.ensure_connection()
    say(READY)
    if not sys.stdin.readline():
        raise SystemExit("no start signal: the driver went away")
    start = time.perf_counter()
    try:
        call_command(command, *args, verbosity=0)
    except SystemExit as exc:  # ox_worker ends its handle() with sys.exit(0)
        if exc.code not in (0, None):
            raise
    end = time.perf_counter()
    return {"executed": list(EXECUTED), "start": start, "end": end}


#: Tasks enqueued before the latency phase measures (connections, imports and caches warm).
LATENCY_WARMUP = 5


def latency(samples: int) -> dict[str, Any]:
    """Enqueue ``stamp`` tasks one at a time to the system's idle worker (started beside this
    process), each after a pause of 50–150 ms once the task before it started (the worker waits
    for work meanwhile, as on an idle system, at a random point of whatever loop it runs); the
    seconds from just before each ``enqueue()`` (which commits) to the task's own recorded start."""
    import random
    from pathlib import Path

    from benchmarks.dtdb_tasks import stamp

    where = Path(os.environ["TASKCLAIM_BENCH_STAMPS"])
    pauses = random.Random(0)
    found: list[float] = []
    for i in range(LATENCY_WARMUP + samples):
        time.sleep(pauses.uniform(0.05, 0.15))  # the idle time being measured, not a synchronisation
        enqueued = time.time()
        stamp.enqueue(i)
        path, deadline = where / str(i), enqueued + 60
        while not path.exists():
            if time.time() > deadline:
                raise RuntimeError(f"task {i} did not start within 60 s")
            time.sleep(0.001)  # a poll of the file the task writes
        if i >= LATENCY_WARMUP:
            found.append(float(path.read_text()) - enqueued)
    return {"latencies": found}


def accepts(command: str, options: list[str]) -> dict[str, Any]:
    """Which of ``options`` (``--concurrency``) the system's worker command takes: a feature
    missing from this version is told apart from one that fails."""
    from django.core.management import get_commands, load_command_class

    parser = load_command_class(get_commands()[command], command).create_parser("manage.py", command)
    known = set(parser._option_string_actions)
    return {"accepts": [option for option in options if option in known]}


def count(system: str) -> dict[str, Any]:
    from benchmarks.tasks_systems import counts

    done, unfinished = counts(system)
    return {"succeeded": done, "unfinished": unfinished}


def main(argv: list[str]) -> int:
    system, role, *rest = argv
    os.environ["TASKCLAIM_BENCH_TASKS_SYSTEM"] = system
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.tasks_settings"
    if role == "setup":
        out = setup(system)
    else:
        import django

        django.setup()
        if role == "prepare":
            out = prepare(system, int(rest[0]), *rest[1:4])
        elif role == "enqueue":
            out = enqueue(system, int(rest[0]), *rest[1:4])
        elif role == "accepts":
            out = accepts(rest[0], rest[1:])
        elif role == "bulk":
            out = bulk(system, int(rest[0]), rest[1])
        elif role == "worker":
            out = worker(rest[0], rest[1:])
        elif role == "count":
            out = count(system)
        elif role == "latency":
            out = latency(int(rest[0]))
        else:
            raise SystemExit(f"unknown role {role!r}")
    say(RESULT + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
