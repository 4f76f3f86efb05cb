"""Handlers for ``taskclaim_worker`` processes started by tests/processes/test_worker.py."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from django_taskclaim.claims import Claim
from tests.testapp.models import Effect


def _started(claim: Claim) -> None:
    """Tell the test this attempt began (a file per key and attempt); on the first attempt of a
    key named ``slow…``, hold still so the test can kill or pause the process here."""
    where = os.environ.get("TASKCLAIM_TEST_STARTED_DIR")
    if where:
        (Path(where) / f"{claim.key}.{claim.attempt}.{os.getpid()}").touch()
    if claim.key.startswith("slow") and claim.attempt == 1:
        time.sleep(float(os.environ.get("TASKCLAIM_TEST_HOLD", "30")))  # the test kills or pauses us here


def effect(claim: Claim) -> Any:
    """For ``--atomic`` workers: the effect commits with the completion (the worker's fenced())."""
    _started(claim)
    Effect.objects.create(task_key=claim.key, token=claim.token, worker=str(os.getpid()))
    return {"by": os.getpid(), "n": (claim.payload or {}).get("n")}


def fenced_effect(claim: Claim) -> None:
    """For plain workers: the effect and the completion in the handler's own fenced() block, after
    the pause point (the worker then stores nothing more)."""
    _started(claim)
    with claim.fenced():
        Effect.objects.create(task_key=claim.key, token=claim.token, worker=str(os.getpid()))
        claim.complete({"by": os.getpid()})


def kills_itself_or_counts(claim: Claim) -> Any:
    """A key named ``killer…`` SIGKILLs its own worker (an OOM kill, a crash in a C extension);
    any other records one effect row a run."""
    if claim.key.startswith("killer"):
        os.kill(os.getpid(), signal.SIGKILL)
    Effect.objects.create(task_key=claim.key, token=claim.token, worker=str(os.getpid()))
    return claim.key


def exits_2_once(claim: Claim) -> Any:
    """A key named ``killer…`` ends its worker with exit code 2 on its first attempt (``os._exit(2)``:
    what a usage error exits with, in the middle of a run); every run records one effect row."""
    if claim.key.startswith("killer") and claim.attempt == 1:
        os._exit(2)
    Effect.objects.create(task_key=claim.key, token=claim.token, worker=str(os.getpid()))
    return claim.key


def fails_its_first_attempt(claim: Claim) -> Any:
    """Raise on a task's first attempt; then succeed, except a key named ``broken…``, which always raises."""
    if claim.attempt == 1 or claim.key.startswith("broken"):
        raise RuntimeError(f"attempt {claim.attempt} of {claim.key} failed")
    return claim.attempt


def stuck_or_paced(claim: Claim) -> Any:
    """Tell the test this attempt began (``_started``). A key named ``stuck…`` then loops for ever,
    heedless of its timeout (a sync call that never returns); any other records one effect row
    after a short wait (I/O-bound work)."""
    _started(claim)
    if claim.key.startswith("stuck"):
        while True:
            time.sleep(0.05)  # the body's own pace: it never ends
    time.sleep(0.2)  # the work: a model or an API call
    Effect.objects.create(task_key=claim.key, token=claim.token, worker=str(os.getpid()))
    return claim.key


def paced_effect(claim: Claim) -> None:
    """For the pool's drain under faults (tests/processes/test_worker_pool_faults.py): I/O-bound work
    (a short wait), then the effect and the completion in one ``fenced()`` block. A key named
    ``late…`` runs past the worker's ``--timeout`` first: its write then must not commit."""
    time.sleep(float(os.environ.get("TASKCLAIM_TEST_WORK", "0.05")))  # a model or an API call
    if claim.key.startswith("late"):
        time.sleep(float(os.environ.get("TASKCLAIM_TEST_LATE", "3")))  # past the worker's --timeout
    with claim.fenced():
        Effect.objects.create(task_key=claim.key, token=claim.token, worker=str(os.getpid()))
        claim.complete({"by": os.getpid()})


def stamps_its_start(claim: Claim) -> str:
    """Write the time this task started (``time.time()``) to a file named by its key in
    ``TASKCLAIM_TEST_STARTED_DIR``: the test compares it with the time it enqueued the task."""
    started = time.time()
    stamp = Path(os.environ["TASKCLAIM_TEST_STARTED_DIR"]) / claim.key
    stamp.with_suffix(".part").write_text(repr(started))
    stamp.with_suffix(".part").rename(stamp)  # whole, when the test sees it
    return claim.key


def waits_for_the_gate(claim: Claim) -> str:
    """Tell the test this attempt began (``_started``), then hold the task in hand until the file
    ``gate`` exists in ``TASKCLAIM_TEST_STARTED_DIR`` (the test opens it, or never does)."""
    _started(claim)
    gate = Path(os.environ["TASKCLAIM_TEST_STARTED_DIR"]) / "gate"
    while not gate.exists():
        time.sleep(0.01)  # the handler's own pace: it waits for the test's file
    Effect.objects.create(task_key=claim.key, token=claim.token, worker=str(os.getpid()))
    return claim.key


def _sleep_in_database(seconds: float) -> None:
    """One statement that holds its connection (and the thread that sent it) for ``seconds``."""
    from django.db import connection

    sql = "SELECT pg_sleep(%s)" if connection.vendor == "postgresql" else "SELECT SLEEP(%s)"
    with connection.cursor() as cursor:
        cursor.execute(sql, [seconds])


async def slow_query_or_quick(claim: Claim) -> None:
    """An async task (tests/processes/test_worker_pool_db_threads.py): a key named ``slowquery…`` holds
    a database statement for ``TASKCLAIM_TEST_QUERY`` seconds, once the others have started; any
    other works 0.5 s, then writes its effect and completes in one ``afenced()`` block."""
    import asyncio

    from asgiref.sync import sync_to_async

    if claim.key.startswith("slowquery"):
        await asyncio.sleep(0.3)  # the quick tasks started meanwhile
        await sync_to_async(_sleep_in_database)(float(os.environ.get("TASKCLAIM_TEST_QUERY", "5")))
        return
    await asyncio.sleep(0.5)  # a model or an API call

    def write() -> None:
        Effect.objects.create(task_key=claim.key, token=claim.token, worker=str(os.getpid()))
        claim.complete({"by": os.getpid()})

    await claim.afenced(write)
