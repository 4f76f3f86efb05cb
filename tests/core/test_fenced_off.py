"""A body fenced off while it runs (its lease expired and another claimant took the task over, or
an operator released or cancelled it): from then on its caller is a duplicate. It gets what a
duplicate delivery would get — the new owner's stored result, ``TaskFailed``, or the ``on_busy``
answer while the new owner runs — never ``StaleClaim``, which stays what the claim's own writes
raise inside the body. The Celery bridge, the LangGraph nodes and the queue worker read an
execution the same way (``Executed.outcome()``); their tests are in their rooms."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from django_taskclaim import arun_once, run_once
from django_taskclaim.exceptions import StaleClaim, TaskBusy, TaskFailed
from django_taskclaim.execution import FencedOff, current_claim, execute
from django_taskclaim.models import Attempt, Task
from django_taskclaim.once import run_claimed
from django_taskclaim.worker import work
from tests.conftest import expire

pytestmark = pytest.mark.django_db(transaction=True)


def take_over(*, lease: float = 30, finish: Any = None) -> Any:
    """Inside a body: its lease runs out and ``thief`` takes the task over (completing it with
    ``finish`` unless that is ``None``); the thief's claim."""
    mine = current_claim()
    expire(mine)
    thief = Task.objects.claim(mine.key, mine.tenant, owner="thief", lease=lease).claim
    assert thief is not None and thief.token == mine.token + 1  # a real takeover: the token moved on
    if finish is not None:
        thief.complete(finish)
    return thief


def test_run_once_fenced_off_returns_the_new_owners_stored_result() -> None:
    def body() -> dict[str, str]:
        take_over(finish={"by": "thief"})
        return {"by": "me"}

    assert run_once("job", body) == {"by": "thief"}  # what a duplicate call returns too
    assert run_once("job", pytest.fail) == {"by": "thief"}
    task = Task.objects.get()
    assert (task.status, task.owner, task.result) == ("succeeded", "thief", {"by": "thief"})
    assert Attempt.objects.get(task=task, token=1).stale_writes == 1  # its completion was refused


def test_run_once_fenced_off_while_the_new_owner_runs_answers_by_on_busy() -> None:
    with pytest.raises(TaskBusy):  # on_busy="raise": what a duplicate call gets now
        run_once("job", lambda: take_over() and "mine")
    assert Task.objects.get().owner == "thief"
    # on_busy="wait": it waits for the new owner, which dies (its lease runs out): it takes over.
    ran: list[int] = []

    def body() -> str:
        ran.append(current_claim().attempt)
        if len(ran) == 1:
            take_over(lease=0.3)  # never completed: the thief's claim runs out
        return f"attempt {current_claim().attempt}"

    Task.objects.all().delete()
    assert run_once("job", body, on_busy="wait") == "attempt 3"
    assert ran == [1, 3]
    assert Task.objects.get().status == "succeeded"


def test_run_once_fenced_off_by_an_operator_is_a_duplicate_of_what_the_operator_did() -> None:
    def cancelled() -> str:
        Task.objects.filter(key="job").cancel()
        return "mine"

    with pytest.raises(TaskFailed):  # cancelled meanwhile: what a duplicate gets
        run_once("job", cancelled)
    assert Task.objects.get().status == "cancelled"
    # Released by an operator (force_release): pending again, so this caller claims it afresh.
    ran: list[int] = []

    def released() -> str:
        ran.append(current_claim().token)
        if len(ran) == 1:
            assert Task.objects.filter(key="again").force_release() == 1
        return f"token {current_claim().token}"

    assert run_once("again", released) == "token 2"
    assert ran == [1, 2]


def test_a_body_that_failed_after_it_was_fenced_off_is_a_duplicate_too() -> None:
    def body() -> None:
        take_over(finish="thief's")
        raise ValueError("mine, too late to record")

    assert run_once("job", body) == "thief's"
    assert Task.objects.get().error == ""  # the failure of a fenced-off claim is not recorded


def test_arun_once_fenced_off_returns_the_new_owners_stored_result() -> None:
    async def body() -> str:
        await sync_to_async(take_over)(finish={"by": "thief"})
        return "mine"

    assert asyncio.run(arun_once("job", body)) == {"by": "thief"}

    async def busy() -> str:
        await sync_to_async(take_over)()
        return "mine"

    with pytest.raises(TaskBusy):
        asyncio.run(arun_once("other", busy))


def test_a_shutdown_reaches_the_caller_even_when_the_claim_was_fenced_off() -> None:
    def body() -> None:
        take_over(finish="thief's")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # control flow, never swallowed as a duplicate's answer
        run_once("job", body)


def test_run_claimed_fenced_off_answers_as_a_duplicate_and_stale_claim_when_nobody_holds_it() -> None:
    claim = Task.objects.claim("job").claim
    assert run_claimed(claim, lambda: take_over(finish=7) and "mine") == 7
    claim = Task.objects.claim("busy").claim
    with pytest.raises(TaskBusy):
        run_claimed(claim, lambda: take_over() and "mine")
    # Released by an operator: nobody holds the task and this call cannot claim it again.
    claim = Task.objects.claim("free").claim

    def released() -> str:
        Task.objects.filter(key="free").force_release()
        return "mine"

    with pytest.raises(StaleClaim):
        run_claimed(claim, released)
    assert Task.objects.get(key="free").status == "pending"


# -- the one reading of an execution ---------------------------------------------------------

def test_outcome_is_the_one_reading_of_an_execution() -> None:
    """``Executed.outcome()``: the value, the stored result when the body completed the claim
    itself, the error raised, or ``FencedOff`` when another owner took the task over."""
    claim = Task.objects.claim("value").claim
    assert execute(claim, lambda: (1, 2)).outcome() == (1, 2)  # as returned (stored as JSON)

    claim = Task.objects.claim("by-body").claim

    def completes_itself() -> str:
        with claim.fenced():
            claim.complete({"stored": (1, 2)})
        return "returned"

    assert execute(claim, completes_itself).outcome() == {"stored": [1, 2]}  # what a duplicate reads

    claim = Task.objects.claim("raised").claim
    with pytest.raises(ZeroDivisionError):
        execute(claim, lambda: 1 / 0).outcome()

    claim = Task.objects.claim("fenced").claim
    executed = execute(claim, lambda: take_over(finish="thief's") and "mine")
    fenced = executed.outcome()
    assert executed.fenced_off and isinstance(fenced, FencedOff) and fenced.claim is claim


def test_run_once_returns_what_its_body_completed_the_claim_with() -> None:
    """The first caller gets the answer every duplicate gets: the stored result."""
    def body() -> str:
        claim = current_claim()
        with claim.fenced():
            claim.complete({"published": True})
        return "returned"

    assert run_once("job", body) == {"published": True} == run_once("job", pytest.fail)


def test_a_worker_counts_a_fenced_off_handler_and_never_fails_its_task() -> None:
    Task.objects.ensure("job", queue="default")

    def handler(claim: Any) -> str:
        expire(claim)
        [thief] = Task.objects.claim_next(owner="thief", lease=30)
        thief.complete("thief's")
        raise ValueError("too late to record")

    stats = work(handler, owner="w", max_tasks=1)
    assert (stats.succeeded, stats.failed, stats.fenced_off) == (0, 0, 1)
    task = Task.objects.get()
    assert (task.status, task.result, task.error) == ("succeeded", "thief's", "")


def test_a_worker_stops_on_a_shutdown_even_when_its_claim_was_fenced_off() -> None:
    """Before, a shutdown whose release was refused (the claim was taken over meanwhile) was
    counted as fenced off and the worker went on to its next task."""
    Task.objects.ensure("job", queue="default")
    Task.objects.ensure("next", queue="default")

    def handler(claim: Any) -> None:
        expire(claim)
        assert Task.objects.claim_next(owner="thief", lease=30)[0].key == "job"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        work(handler, owner="w", until_drained=True)
    assert Task.objects.get(key="next").status == "pending"  # the worker stopped: never run here
