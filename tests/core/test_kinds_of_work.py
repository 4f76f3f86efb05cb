"""A key names one kind of work: a task claimed by key (``claim()``, ``run_once``, the Celery
bridge, LangGraph nodes), or a queued task and what runs it (a Django task's path, or a
handler's work). Whoever meets the other kind under the key is refused (``InvalidTaskKey …
already names other work``), in both directions, and the task is left as it was."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections

from django_taskclaim import arun_once, run_once
from django_taskclaim.exceptions import InvalidTaskKey
from django_taskclaim.models import Attempt, Task

pytestmark = pytest.mark.django_db(transaction=True)

OTHER_WORK = "already names other work"


def run(coro: Any) -> Any:
    async def main() -> Any:
        try:
            return await coro
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(main())


def never(*args: Any) -> None:
    raise AssertionError("the body of a refused claim ran")


async def anever(*args: Any) -> None:
    raise AssertionError("the body of a refused claim ran")


#: Every way to claim by key, sync and async.
CLAIMS_BY_KEY: dict[str, Callable[[str], Any]] = {
    "claim": lambda key: Task.objects.claim(key, owner="by-key"),
    "aclaim": lambda key: run(Task.objects.aclaim(key, owner="by-key")),
    "run_once": lambda key: run_once(key, never),
    "arun_once": lambda key: run(arun_once(key, anever)),
    "claim with a payload": lambda key: Task.objects.claim(key, payload={"other": 1}),
}


def queued(key: str, state: str) -> Task:
    """A queued task (a handler's work) of ``key`` in ``state``."""
    Task.objects.ensure(key, queue="default", payload={"n": 1})
    if state in ("running", "succeeded"):
        [claim] = Task.objects.claim_next(owner="worker")
        if state == "succeeded":
            claim.complete({"done": True})
    return Task.objects.get(key=key)


def snapshot(key: str) -> tuple[Any, ...]:
    task = Task.objects.get(key=key)
    return (task.status, task.owner, task.fencing_token, task.attempts, task.result, task.payload,
            Attempt.objects.filter(task=task).count())


@pytest.mark.parametrize("state", ["pending", "running", "succeeded"])
@pytest.mark.parametrize("how", list(CLAIMS_BY_KEY))
def test_a_claim_by_key_refuses_a_queued_task(how: str, state: str) -> None:
    queued("job-1", state)
    before = snapshot("job-1")
    with pytest.raises(InvalidTaskKey, match=OTHER_WORK) as info:
        CLAIMS_BY_KEY[how]("job-1")
    assert "a task claimed by key" in str(info.value) and "'default'" in str(info.value)
    assert snapshot("job-1") == before  # not claimed, not counted, no duplicate delivery recorded


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's claim statements")
@pytest.mark.parametrize("kind", ["insert", "lean", "reading"])
def test_every_claim_statement_refuses_it(kind: str) -> None:
    from django_taskclaim.store import prepared

    queued("job-2", "succeeded")
    before = snapshot("job-2")
    with prepared.cursor(connection) as cursor:
        prepared.set_claim_hint(cursor, kind)
    with pytest.raises(InvalidTaskKey, match=OTHER_WORK):
        Task.objects.claim("job-2")
    assert snapshot("job-2") == before


def test_ensure_refuses_the_other_kind_both_ways() -> None:
    Task.objects.ensure("by-key")
    queued("queued", "pending")
    with pytest.raises(InvalidTaskKey, match=OTHER_WORK):
        Task.objects.ensure("by-key", queue="default")
    with pytest.raises(InvalidTaskKey, match=OTHER_WORK):
        Task.objects.ensure("queued")  # by key
    with pytest.raises(InvalidTaskKey, match=OTHER_WORK):
        Task.objects.ensure("queued", queue="default", task_path="tests.testapp.tasks.add")
    # The same kind is the same task, whatever its queue is called now.
    assert Task.objects.ensure("queued", queue="emails").pk == Task.objects.get(key="queued").pk
    assert Task.objects.ensure("by-key").queue is None


def test_a_refused_ensure_leaves_the_task_as_it_was() -> None:
    Task.objects.ensure("by-key")  # no payload yet: an ensure() that may go on stores its payload
    with pytest.raises(InvalidTaskKey, match=OTHER_WORK):
        Task.objects.ensure("by-key", payload={"n": 2}, queue="default")
    assert Task.objects.get(key="by-key").payload is None


def test_a_claim_by_key_of_its_own_kind_still_works() -> None:
    Task.objects.ensure("mine")
    assert Task.objects.claim("mine").claimed
    assert run_once("fresh", lambda: 3) == 3
