"""Django tasks of the test suite (run by ClaimBackend and ``taskclaim_worker``)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async

from django_taskclaim import TaskKey
from django_taskclaim.tasks import claim_options, current_claim, keyed
from django_taskclaim.tasks.compat import Task

try:
    from django.tasks import task  # type: ignore[attr-defined,unused-ignore]
except ImportError:
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]

from .models import Effect


def _mark(name: str) -> None:
    """Tell a test this body started (a file per start), and hold still where asked to."""
    where = os.environ.get("TASKCLAIM_TEST_STARTED_DIR")
    if where:
        Path(where, f"{name}.{os.getpid()}.{time.monotonic_ns()}").touch()
    hold = os.environ.get("TASKCLAIM_TEST_HOLD_FIRST")
    if hold and current_claim().attempt == 1:
        time.sleep(float(hold))  # the test kills or pauses this process here


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
async def add_async(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task(takes_context=True)
def attempt_number(context: Any, fail_until: int = 0) -> dict[str, Any]:
    if context.attempt <= fail_until:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return {"attempt": context.attempt, "id": context.task_result.id}


@task()
def fails(message: str) -> None:
    raise ValueError(message)


@task()
def exits() -> None:
    raise SystemExit(3)


@task()
def returns_a_set() -> Any:
    return {1, 2}


@task(queue_name="emails", priority=10)
def send_email(to: str) -> str:
    Effect.objects.create(task_key=f"email:{to}", token=current_claim().token, worker=str(os.getpid()))
    return f"sent to {to}"


@task()
def ordered(name: str) -> str:
    Effect.objects.create(task_key=f"order:{name}", token=current_claim().token, worker=str(os.getpid()))
    return name


@task()
@keyed(lambda order_id, amount=0: TaskKey("charge", run=f"order-{order_id}", tenant="acme"))
@claim_options(max_attempts=3)
def charge(order_id: int, amount: int = 0) -> str:
    _mark(f"charge-{order_id}")
    claim = current_claim()
    with claim.fenced():  # the payment commits with the completion, once
        Effect.objects.create(task_key=f"charge:{order_id}", token=claim.token, worker=str(os.getpid()))
        claim.complete(f"charged {amount}")
    return "charged"


@task()
@keyed(lambda n: TaskKey("flaky", run=str(n)), after_failure="run_again")
@claim_options(max_attempts=1)
def flaky_once(n: int) -> int:
    if not Effect.objects.filter(task_key=f"flaky:{n}").exists():
        Effect.objects.create(task_key=f"flaky:{n}", token=current_claim().token, worker="first")
        raise RuntimeError("first time fails")
    return n


@task()
@keyed(lambda n: TaskKey("stays-failed", run=str(n)))
@claim_options(max_attempts=1)
def stays_failed(n: int) -> None:
    raise RuntimeError("fails for good")


@task()
def effect(name: str) -> str:
    """One effect under the claim's fence, after the point where a test may kill or pause us."""
    _mark(name)
    claim = current_claim()
    with claim.fenced():
        Effect.objects.create(task_key=name, token=claim.token, worker=str(os.getpid()))
        claim.complete({"by": os.getpid()})
    return "done"


@task()
@claim_options(max_attempts=1)
def last_chance(name: str) -> str:
    """One attempt only: a worker that dies in it leaves nothing to retry."""
    _mark(name)
    return "survived"


@task(priority=10)
@claim_options(max_attempts=3)
def kills_its_worker() -> None:
    """Dies with its worker, as an OOM kill or a crash in a C extension would: SIGKILL to itself."""
    os.kill(os.getpid(), signal.SIGKILL)


@task()
@claim_options(max_attempts=3)
def counted(name: str) -> str:
    """One effect row a run (not fenced: a second run would show as a second row)."""
    Effect.objects.create(task_key=name, token=current_claim().token, worker=str(os.getpid()))
    return name


__all__ = ["Task"]


@task()
def tick(label: str = "") -> dict[str, Any]:
    """A schedule's task (tests of TASKCLAIM_SCHEDULES): the tick it runs as, by its claim's key."""
    return {"key": current_claim().key, "label": label}


@task(queue_name="emails", priority=7)
@keyed(lambda label="": TaskKey("not-the-tick", run=label))
def keyed_tick(label: str = "") -> str:
    """A keyed task fired by a schedule: the tick's key wins over the task's own identity."""
    return current_claim().key


def _called(name: str) -> str:
    """A step's function: record the call (committed at once), return its name."""
    Effect.objects.create(task_key=name, token=current_claim().token, worker="")
    return name.upper()


@task(takes_context=True)
def stepped(context: Any, fail_until: int = 0) -> list[str]:
    """Two durable steps with a failure between them until attempt ``fail_until`` has passed."""
    claim = current_claim()
    first = claim.step("first", _called, "stepped:first")
    if context.attempt <= fail_until:
        raise RuntimeError(f"attempt {context.attempt} fails after its first step")
    return [first, claim.step("second", _called, "stepped:second")]


@task(takes_context=True)
async def astepped(context: Any, fail_until: int = 0) -> list[str]:
    """:func:`stepped`, async: ``claim.astep``."""
    claim = current_claim()

    async def called(name: str) -> str:
        await asyncio.sleep(0)
        return await sync_to_async(_called)(name)

    first = await claim.astep("first", called, "astepped:first")
    if context.attempt <= fail_until:
        raise RuntimeError(f"attempt {context.attempt} fails after its first step")
    return [first, await claim.astep("second", called, "astepped:second")]
