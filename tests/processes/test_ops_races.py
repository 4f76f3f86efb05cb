"""Operators racing workers, as separate OS processes: purge beside claims, cancel and the
admin's cancel action beside busy SQLite writers, many queue workers on one SQLite file.

Every process reports each exception it met; the tests assert there were none (no
``IntegrityError`` from a task purged under a claim, no "database is locked") and that what
the workers saw is a valid outcome.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from django.db import connection

from devtools.processes import Child, Supervisor
from django_taskclaim.models import Task

pytestmark = pytest.mark.django_db(transaction=True)

Spawn = Callable[..., Child]


@pytest.fixture
def spawn_ops(processes: Supervisor) -> Spawn:
    """Start ``python -m tests.programs.ops ARGS`` children of ``processes``."""
    return partial(processes.start, "tests.programs.ops")


def spawn_fleet(processes: Supervisor, copies: int, *args: str, env: dict[str, str] | None = None) -> Child:
    """``copies`` processes of ``python -m tests.programs.ops ARGS`` forked from one that set Django
    up (tests/programs/fleet.py): each its own process and connection, one Django start-up."""
    return processes.start("tests.programs.fleet", str(copies), "tests.programs.ops", *args, env=env, group=True)


def run_together(processes: Supervisor, procs: list[Child], timeout: float = 240,
                 copies: dict[Child, int] | None = None) -> list[dict[str, Any]]:
    """Wait until every process is connected (each of a fleet's ``copies``), start them at once,
    return each one's exit event (a fleet's in the order they came)."""
    count = {proc: (copies or {}).get(proc, 1) for proc in procs}
    ready = [proc.event("ready", timeout=60) for proc in procs for _ in range(count[proc])]
    assert len({r["pid"] for r in ready}) == len(ready), ready  # as many processes as asked for
    for proc in procs:
        proc.send("go")
    exits = [proc.event("exit", timeout=timeout) for proc in procs for _ in range(count[proc])]
    for proc in procs:
        proc.end_input()
        proc.finish(timeout)  # exit code 0 (a fleet: every copy's)
    return exits


def all_errors(exits: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [error for exit_ in exits for error in exit_["errors"]]


# -- item: a purge racing claims ---------------------------------------------------------------
def test_claims_racing_a_purge_loop_never_raise(processes: Supervisor, spawn_ops: Spawn) -> None:
    """Claims of a few keys, done and purged over and over: a claim whose task vanished between
    its statements claims it afresh; none raises ``IntegrityError``, and every claim that lost
    saw the task running or succeeded (with its result)."""
    # Half of them ensure() first: its read after a conflicting insert can race the purge too.
    # On MariaDB the ensure()s insert each purged key again at once: racing inserts deadlock, and
    # the victims, tried again all at once, deadlocked again (run with six claimers for 25 s to see
    # it every time).
    claimers = [spawn_ops("claimer", "--seconds", "6", "--keys", "6", *(["--ensure"] if i % 2 else []))
                for i in range(4)]
    purger = spawn_ops("operator", "purge", "--seconds", "6", "--backdate")
    exits = run_together(processes, [*claimers, purger])
    errors = all_errors(exits)
    assert errors == [], (Counter(e["type"] for e in errors), errors[:3])  # each with where it was raised
    counts: Counter[str] = Counter()
    for exit_ in exits[:-1]:
        counts.update(exit_["counts"])
        assert exit_["invalid"] == []
    assert exits[-1]["runs"] > 10, exits[-1]  # the purge did run, over and over
    # Keys were claimed afresh after purges, and the other claims found them done.
    print("purge-race figures:", dict(counts), "purge runs:", exits[-1]["runs"])
    assert counts["claimed"] > 6 and counts["succeeded"] > 0 and counts["ensured"] > 0, counts


# -- item: SQLite writers beside operator actions ----------------------------------------------
def effects_by_key() -> Counter[str]:
    from tests.testapp.models import Effect

    return Counter(Effect.objects.values_list("task_key", flat=True))


def test_operator_actions_beside_busy_workers_never_fail(processes: Supervisor, spawn_ops: Spawn) -> None:
    """8 queue workers (claim_next + fenced()) drain the table while QuerySet.cancel(), the
    admin's cancel action and taskclaim_purge run in loops beside them. On SQLite an action that
    read before it wrote failed at once with "database is locked"; none may fail, and each task
    ends with its effect applied once (succeeded) or never (cancelled)."""
    for i in range(300):
        Task.objects.ensure(f"w-{i}", queue="default")
    for i in range(100):
        Task.objects.ensure(f"c-{i}", queue="default")  # cancelled by QuerySet.cancel()
        Task.objects.ensure(f"a-{i}", queue="default")  # cancelled by the admin action
    workers = spawn_fleet(processes, 8, "drain", "--seconds", "60", "--until-empty", "--work-ms", "5")
    rounds = ("--min-runs", "10", "--seconds", "4", "--pause", "0.02")
    operators = [
        spawn_ops("operator", "cancel", "--prefix", "c-", *rounds),
        spawn_ops("operator", "admin-cancel", "--prefix", "a-", *rounds),
        spawn_ops("operator", "purge", "--status", "succeeded", *rounds),
    ]
    exits = run_together(processes, [workers, *operators], copies={workers: 8})
    errors = all_errors(exits)
    assert errors == [], Counter((e["type"], e["text"]) for e in errors)
    assert not Task.objects.unfinished().exists()
    effects = effects_by_key()
    assert max(effects.values()) == 1  # keys are never reused here: purged or not, one effect
    for key, status in Task.objects.values_list("key", "status"):
        assert effects[key] == (1 if status == "succeeded" else 0), (key, status, effects[key])
    assert len(effects) + Task.objects.filter(status="cancelled").count() == 500
    # What the two cancelling operators report having cancelled is what is cancelled.
    assert sum(exit_["changed"] for exit_ in exits[8:]) == Task.objects.filter(status="cancelled").count()
    print("operator-race figures:", Counter(Task.objects.values_list("status", flat=True)),
          "operator runs:", [exit_["runs"] for exit_ in exits[8:]])


def test_many_sqlite_queue_workers_with_the_recommended_busy_timeout(processes: Supervisor, spawn_ops: Spawn) -> None:
    """24 workers claim_next + fenced() on one SQLite file with the busy timeout the docs
    recommend (store.sqlite.RECOMMENDED_TIMEOUT): none sees "database is locked", and every
    task's effect is applied exactly once."""
    from django_taskclaim.store.sqlite import RECOMMENDED_TIMEOUT

    if connection.vendor != "sqlite":
        pytest.skip("the busy timeout is SQLite's")
    for i in range(480):
        Task.objects.ensure(f"q-{i}", queue="default")
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings_ops",
           "TASKCLAIM_TEST_SQLITE_TIMEOUT": str(RECOMMENDED_TIMEOUT)}
    workers = spawn_fleet(processes, 24, "drain", "--seconds", "300", "--until-empty", "--work-ms", "3", env=env)
    exits = run_together(processes, [workers], timeout=400, copies={workers: 24})
    errors = all_errors(exits)
    assert errors == [], Counter((e["type"], e["text"]) for e in errors)
    assert Task.objects.succeeded().count() == 480
    effects = effects_by_key()
    assert len(effects) == 480 and set(effects.values()) == {1}
