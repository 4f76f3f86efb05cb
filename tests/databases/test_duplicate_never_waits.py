"""A duplicate delivery never waits for the owner's transaction, on every database.

An owner process claims a key and holds ``fenced()`` open (its row lock on PostgreSQL and
MySQL/MariaDB, SQLite's one write lock) until the test tells it to commit. A second process
claims the same key meanwhile: it must answer "not claimed, running" while the owner still holds
the block, not after the owner's commit (or after the database's lock wait timeout).
"""

from __future__ import annotations

import pytest
from django.db import connection

from django_taskclaim.models import Attempt, Task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: Well under the lock waits the duplicate would otherwise sit out (InnoDB's 50 s, the suite's
#: SQLite busy timeout of 60 s), and long enough for a loaded machine to start a process.
DEADLINE = 30


def test_a_duplicate_answers_while_the_owner_holds_fenced(processes, spawn) -> None:  # type: ignore[no-untyped-def]
    owner = spawn("fenced-owner", "job", "--lease", "300")
    owner.event("inside", timeout=60)
    duplicate = spawn("race", "job")
    processes.go(duplicate)
    try:
        answer = duplicate.event("done", timeout=DEADLINE)
        # The owner is still inside fenced(): it commits only once told to, below.
        assert not [e for e in owner.events if e["event"] == "committed"]
    finally:
        owner.send("go")
    assert (answer["claimed"], answer["status"], answer["token"]) == (False, "running", 1)
    assert answer["owner"] == f"owner-{owner.pid}"
    processes.join(timeout=120)
    assert [p.returncode for p in processes.children] == [0, 0], processes.failures()
    task = Task.objects.get(key="job")
    assert (task.status, task.fencing_token) == ("succeeded", 1)
    duplicates = Attempt.objects.filter(outcome="duplicate", owner=f"racer-{duplicate.pid}").count()
    # PostgreSQL records the duplicate beside the owner's row lock. MySQL's audit row would wait for
    # it (its foreign key share-locks the task row), SQLite's for the one write lock the owner holds:
    # there it is left out once duplicate_record_wait has passed (docs/databases.md).
    assert duplicates == (1 if connection.vendor == "postgresql" else 0)
