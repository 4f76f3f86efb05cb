"""``fenced()`` against writes to another database: the other database refuses them itself.

A write elsewhere would commit on its own, whatever becomes of the claim. Reading a statement's
first word cannot tell a write (a leading comment, ``SELECT f()`` where ``f`` writes, ``DO $$ … $$``),
so while the block runs every statement sent to another database runs read-only there (a
``READ ONLY`` transaction on PostgreSQL and MySQL/MariaDB, ``PRAGMA query_only`` on SQLite), and
the setting is gone once the statement ends. Here the other database is ``twin``: a second alias
of the task database (another session to the same database, as a read replica alias or a second
alias for the same server is), on every database the suite runs on; the two servers of the
sharded configurations are in tests/databases/test_sharded.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from django_taskclaim.conf import settings as tc_settings
from django_taskclaim.exceptions import TaskClaimError
from django_taskclaim.models import Task
from tests.testapp.models import Effect

TWIN = "twin"
EFFECT = "testapp_effect"  # Effect's table, written as text in the statements below
INSERT = "INSERT INTO testapp_effect (task_key, token, worker, created_at) VALUES (%s, %s, %s, %s)"
TASKS = tc_settings.DATABASE  # the task database, where Effect is too (tests.routers)
VENDOR = connections[TASKS].vendor


@pytest.fixture(scope="module")
def twin_alias() -> Iterator[None]:
    """A second alias of the task database (another session to it, not a task database), declared
    before each test's database access is set up, so that the test may use it."""
    found = dict(connections.settings[TASKS])
    found["OPTIONS"] = dict(found.get("OPTIONS") or {})
    if VENDOR == "sqlite":
        found["OPTIONS"]["timeout"] = 1  # a write waiting for the block's write lock fails in 1 s, not 60
    connections.settings[TWIN] = found
    try:
        yield
    finally:
        other = connections[TWIN]
        other.close()
        if getattr(other, "pool", None) is not None:
            other.close_pool()
        del connections[TWIN]
        del connections.settings[TWIN]


pytestmark = [pytest.mark.usefixtures("twin_alias"), pytest.mark.django_db(transaction=True, databases="__all__")]


@pytest.fixture
def twin() -> Any:
    assert Effect._meta.db_table == EFFECT
    return connections[TWIN]


@pytest.fixture
def writing_function() -> Iterator[str]:
    """``SELECT taskclaim_test_write()``: a statement whose first word reads, which writes."""
    insert = "INSERT INTO testapp_effect (task_key, token, worker, created_at) VALUES ('function', 1, 'f', {now})"
    insert = insert.format(now="now()" if VENDOR == "postgresql" else "UTC_TIMESTAMP(6)")
    with connections[TASKS].cursor() as cursor:
        if VENDOR == "postgresql":
            cursor.execute(f"CREATE OR REPLACE FUNCTION taskclaim_test_write() RETURNS int "
                           f"AS $$ {insert}; SELECT 1 $$ LANGUAGE sql")
        else:
            cursor.execute(f"CREATE OR REPLACE FUNCTION taskclaim_test_write() RETURNS int MODIFIES SQL DATA "
                           f"BEGIN {insert}; RETURN 1; END")
    try:
        yield "SELECT taskclaim_test_write()"
    finally:
        with connections[TASKS].cursor() as cursor:
            cursor.execute("DROP FUNCTION IF EXISTS taskclaim_test_write" + ("()" if VENDOR == "postgresql" else ""))


def hidden_writes() -> list[Any]:
    """Writes whose first word is not one: each vendor's that it can run."""
    found: list[Any] = [
        pytest.param(f"/* app */ {INSERT}", True, id="block-comment"),
        pytest.param(f"-- x\n{INSERT}", True, id="line-comment"),
    ]
    if VENDOR in ("postgresql", "mysql"):
        found.append(pytest.param("function", False, id="select-function"))
    if VENDOR == "postgresql":
        found.append(pytest.param("DO $$ BEGIN INSERT INTO testapp_effect (task_key, token, worker, created_at) "
                                  "VALUES ('do', 1, 'w', now()); END $$", False, id="do-block"))
    return found


def claimed() -> Any:
    claim = Task.objects.claim("pay").claim
    assert claim is not None
    return claim


@pytest.mark.parametrize(("sql", "with_params"), hidden_writes())
def test_a_write_to_another_database_that_hides_its_first_word_is_refused(
        twin: Any, request: pytest.FixtureRequest, sql: str, with_params: bool) -> None:
    if sql == "function":
        sql = request.getfixturevalue("writing_function")
    claim = claimed()
    with pytest.raises(TaskClaimError) as refused, claim.fenced():
        claim.complete("paid")
        with twin.cursor() as cursor:
            cursor.execute(sql, ["hidden", claim.token, "w", timezone.now()] if with_params else None)
    message = str(refused.value)
    assert f"wrote to database {TWIN!r}" in message and f"commits on database {TASKS!r}" in message, message
    assert not Effect.objects.exists()  # nothing survived, in the twin's session or the claim's
    task = Task.objects.get(key="pay")
    assert task.status == "running" and task.fencing_token == claim.token  # the block rolled back


def test_the_task_database_stays_writable_and_the_other_one_is_writable_again(twin: Any) -> None:
    claim = claimed()
    with claim.fenced():
        with twin.cursor() as cursor:  # reading elsewhere is allowed, and sees the committed rows
            cursor.execute("SELECT COUNT(*) FROM testapp_effect")
            assert cursor.fetchone()[0] == 0
        Effect.objects.create(task_key="pay", token=claim.token, worker="w")  # the task database: written
        claim.complete("paid")
    assert Effect.objects.get().task_key == "pay" and Task.objects.get(key="pay").status == "succeeded"
    assert_writable(twin)
    # After a refused write too, on the session that refused it.
    other = Task.objects.claim("other").claim
    assert other is not None
    with pytest.raises(TaskClaimError), other.fenced(), twin.cursor() as cursor:
        cursor.execute(f"/* x */ {INSERT}", ["refused", other.token, "w", timezone.now()])
    assert_writable(twin)
    assert not Effect.objects.filter(task_key="refused").exists()
    # Another error of the other database is its own, raised as it is; the session is fine after it.
    with pytest.raises(DatabaseError) as failed, other.fenced(), twin.cursor() as cursor:
        cursor.execute("SELECT no_such_column FROM testapp_effect")
    assert not isinstance(failed.value, TaskClaimError)
    assert_writable(twin)


def test_afenced_refuses_a_hidden_write_to_another_database() -> None:
    """The awaitable twin runs the same block on the ORM's thread, where that thread's connections
    are watched."""
    claim = claimed()

    def publish() -> None:
        claim.complete("paid")
        with connections[TWIN].cursor() as cursor:
            cursor.execute(f"-- x\n{INSERT}", ["hidden", claim.token, "w", timezone.now()])

    async def main() -> None:
        try:
            await claim.afenced(publish)
        finally:
            await sync_to_async(connections.close_all)()

    with pytest.raises(TaskClaimError, match=f"wrote to database {TWIN!r}"):
        asyncio.run(main())
    assert not Effect.objects.exists() and Task.objects.get(key="pay").status == "running"


@pytest.mark.skipif(VENDOR == "sqlite", reason="one writer per SQLite file: the twin's open write transaction would "
                    "hold the claim's commit; the sharded_mixed configuration has SQLite as another file")
@pytest.mark.parametrize("how", ["atomic", "autocommit_off"])
def test_another_database_in_a_transaction_the_block_did_not_open(twin: Any, how: str) -> None:
    """The other database's transaction was open before the block (``ATOMIC_REQUESTS``, autocommit
    off): the block's statements there are read-only, and the transaction goes on writable after."""
    claim = claimed()
    if how == "atomic":
        outer = transaction.atomic(using=TWIN)
        outer.__enter__()
    else:
        twin.set_autocommit(False)
    try:
        with twin.cursor() as cursor:
            cursor.execute(INSERT, ["before", 1, "w", timezone.now()])
        if VENDOR == "mysql":
            # MySQL cannot make a transaction read-only once it began: nothing is sent there.
            with pytest.raises(TaskClaimError, match="has a transaction open"), claim.fenced(), \
                    twin.cursor() as cursor:
                cursor.execute("SELECT COUNT(*) FROM testapp_effect")
        else:
            with claim.fenced():
                with twin.cursor() as cursor:
                    cursor.execute("SELECT COUNT(*) FROM testapp_effect WHERE task_key = %s", ["before"])
                    assert cursor.fetchone()[0] == 1  # its own transaction's row
                with transaction.atomic(using=TWIN):  # a savepoint of Django's own, kept as it is
                    assert Effect.objects.using(TWIN).filter(task_key="before").count() == 1
                claim.check()
            with pytest.raises(TaskClaimError), claim.fenced(), twin.cursor() as cursor:
                cursor.execute(f"-- x\n{INSERT}", ["hidden", claim.token, "w", timezone.now()])
            if VENDOR == "postgresql" and not twin.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
                # A server-side cursor would close with the savepoint that made it read-only.
                with pytest.raises(TaskClaimError, match="server-side cursor"), claim.fenced():
                    list(Effect.objects.using(TWIN).iterator())
        with twin.cursor() as cursor:  # the transaction goes on, writable
            cursor.execute(INSERT, ["after", 1, "w", timezone.now()])
    finally:
        if how == "atomic":
            outer.__exit__(None, None, None)
        else:
            twin.commit()
            twin.set_autocommit(True)
    assert sorted(Effect.objects.values_list("task_key", flat=True)) == ["after", "before"]
    assert_writable(twin)


def assert_writable(twin: Any) -> None:
    """The other session writes in autocommit again: nothing read-only was left behind on it."""
    with twin.cursor() as cursor:
        if VENDOR == "postgresql":
            cursor.execute("SELECT current_setting('transaction_read_only'), "
                           "current_setting('default_transaction_read_only')")
            assert cursor.fetchone() == ("off", "off")
        elif VENDOR == "sqlite":
            cursor.execute("PRAGMA query_only")
            assert cursor.fetchone()[0] == 0
        cursor.execute(INSERT, ["writable", 1, "w", timezone.now()])
    assert Effect.objects.filter(task_key="writable").count() == 1
    Effect.objects.filter(task_key="writable").delete()
