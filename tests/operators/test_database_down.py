"""What an operator meets when one task database is down (the sharded configurations; the second
server stopped for real with ``pg_ctl stop``): each command names the database once, goes on with
the others and exits 3; ``get_result()`` raises ``DatabaseUnreachable`` naming it; the admin's page
of that database says so (503), never a 500; a worker logs the database down once, not on every
poll, and once more when it answers again.
"""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connections
from django.urls import reverse

from devtools.polling import wait_until
from devtools.servers import PostgresServer
from django_taskclaim import outages, worker
from django_taskclaim.exceptions import DatabaseUnreachable
from django_taskclaim.models import Task
from tests.sharding import ON_A, ON_B, SHARDED_TESTS, A, B

pytestmark = SHARDED_TESTS


@pytest.fixture
def down(shard_server: PostgresServer) -> Iterator[PostgresServer]:
    """The second server stopped (``pg_ctl stop``), started again afterwards."""
    outages.forget()
    connections[B].close()
    shard_server.halt()
    yield shard_server  # started again by shard_server
    outages.forget()


def command(*args: str) -> tuple[int, str, str, str]:
    """Run a command: its exit code (0 when it returned), stdout, stderr and the error's message."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command(*args, stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), err.getvalue(), str(exc)
    return 0, out.getvalue(), err.getvalue(), ""


def assert_named_once(*texts: str) -> None:
    for text in texts:
        for line in text.splitlines():
            assert line.count("shard2") <= 1, line  # the database named once, not twice
        assert "Traceback" not in text


@pytest.mark.parametrize("args", [
    ("taskclaim_inspect",), ("taskclaim_inspect", "--json"), ("taskclaim_audit",), ("taskclaim_audit", "--json"),
    ("taskclaim_purge", "--older-than", "1s", "--dry-run"), ("taskclaim_purge", "--older-than", "1s", "--json"),
    ("taskclaim_reclaim",), ("taskclaim_reclaim", "--dry-run", "--json"),
], ids=" ".join)
def test_each_command_goes_on_past_a_database_that_is_down_and_exits_3(down: PostgresServer,
                                                                       args: tuple[str, ...]) -> None:
    Task.objects.ensure("queued", tenant=ON_A[0], queue="default")
    done = Task.objects.claim("done", tenant=ON_A[1]).claim
    assert done is not None
    done.complete()
    code, out, err, message = command(*args)
    assert code == 3, (out, err, message)
    assert message.count("'shard2'") == 1 and "could not be reached" in message
    assert err.count("cannot be reached") == 1 and len(err.strip().splitlines()) == 1, err
    assert_named_once(err, message, *(() if "--json" in args else (out,)))
    if "--json" in args:
        report = json.loads(out)
        assert list(report["unreachable"]) == [B] and report["unreachable"][B].count("shard2") == 1
    if args[0] == "taskclaim_inspect":  # the other database's queue is listed all the same
        assert "default" in out and ("due" in out or '"queues"' in out)


def test_inspect_of_a_task_in_a_database_that_is_down_names_it_once(down: PostgresServer) -> None:
    code, out, err, message = command("taskclaim_inspect", "report", "--tenant", ON_B[0])
    assert code == 3 and message.startswith("task database 'shard2' cannot be reached: "), message
    assert_named_once(message)


def test_get_result_of_a_database_that_is_down_raises_database_unreachable(shard_server: PostgresServer) -> None:
    from tests.programs.routing_tasks import invoice

    result = invoice.enqueue(ON_B[0], 1)
    connections[B].close()
    shard_server.halt()
    try:
        with pytest.raises(DatabaseUnreachable) as raised:
            invoice.get_result(result.id)
    finally:
        shard_server.resume()
    error = raised.value
    assert error.alias == B and str(error).count("shard2") == 1 and "\n" not in str(error)
    assert str(error).startswith("task database 'shard2' cannot be reached: ")
    assert isinstance(error, OperationalError) and isinstance(error.__cause__, OperationalError)
    connections[B].close()
    assert invoice.get_result(result.id).id == result.id  # back: read as before


def test_the_admin_page_of_a_database_that_is_down_says_so(admin_client: Any, down: PostgresServer) -> None:
    changelist = reverse("admin:django_taskclaim_task_changelist")
    page = admin_client.get(changelist, {"database": B})
    assert page.status_code == 503
    text = page.content.decode()
    assert "task database &#x27;shard2&#x27; cannot be reached" in text and "?database=default" in text
    change = reverse("admin:django_taskclaim_task_change", args=[1])
    assert admin_client.get(change, {"database": B}).status_code == 503
    assert admin_client.get(changelist).status_code == 200  # the other database's list is as ever


def test_a_worker_logs_a_database_down_once_and_once_when_it_is_back(
        down: PostgresServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    polls = {A: 0, B: 0}
    real = worker.claim_next

    def counted(*args: Any, **kwargs: Any) -> Any:
        for alias in (A, B) if kwargs.get("using") is None else (kwargs["using"],):
            polls[alias] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(worker, "claim_next", counted)
    Task.objects.ensure("a-0", tenant=ON_A[0], queue="default")
    stop = threading.Event()
    ran: list[str] = []
    # A daemon, and so are the lanes it starts: a worker that never stops fails the test below, and
    # cannot keep pytest from exiting.
    thread = threading.Thread(target=worker.work, args=(lambda claim: ran.append(claim.using),),
                              kwargs={"poll": 0.01, "stop": stop}, daemon=True)
    caplog.set_level(logging.INFO, logger="django_taskclaim")
    thread.start()
    try:
        wait_until(lambda: polls[B] >= 30 and ran == [A], timeout=30, what="30 polls of the stopped database")
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("task database 'shard2'")]
        assert len(lines) == 1, lines  # the broken worker logged one error a poll
        assert lines[0].startswith("task database 'shard2' cannot be reached: ") and "\n" not in lines[0]
        connections[B].close()
        down.resume()
        Task.objects.ensure("b-0", tenant=ON_B[0], queue="default")
        wait_until(lambda: B in ran, timeout=30, what="the task of the database started again")
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive(), "the worker did not stop within 30 s of its stop event"
    # Lines about the database itself (a task's own lines name it too: "id=shard2:7").
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("task database 'shard2'")]
    assert lines[1:] == ["task database 'shard2' answers again"], lines
