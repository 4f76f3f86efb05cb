"""Async worker programs for the tests: ``python -m tests.programs.async_claimer MODE …``, one JSON event a line.

- ``gather KEY --callers N``: N concurrent ``arun_once`` callers for KEY in one event loop.
- ``hold KEY --lease S``: claim KEY and hold it under ``akeepalive`` until a line arrives on stdin.
- ``contend KEY``: try to claim KEY every 50 ms until a line arrives on stdin; report the wins.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from asgiref.sync import sync_to_async

from tests.programs.claimer import emit, setup


async def gather(args: argparse.Namespace) -> None:
    from django_taskclaim import arun_once
    from tests.testapp.models import Effect

    me = f"gather-{os.getpid()}"

    async def work() -> dict[str, str]:
        await Effect.objects.acreate(task_key=args.key, token=0, worker=me)
        await asyncio.sleep(args.work)
        return {"by": me}

    emit(event="ready", pid=os.getpid())
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    results = await asyncio.gather(*(arun_once(args.key, work, on_busy="wait", lease=args.lease)
                                     for _ in range(args.callers)))
    emit(event="results", results=results)


async def hold(args: argparse.Namespace) -> None:
    from django_taskclaim.exceptions import StaleClaim
    from django_taskclaim.models import Task
    from tests.testapp.models import Effect

    outcome = await Task.objects.aclaim(args.key, lease=args.lease, owner=f"holder-{os.getpid()}")
    assert outcome.claim is not None
    claim = outcome.claim
    emit(event="claimed", token=claim.token)
    try:
        async with claim.akeepalive():
            # A long coroutine, several leases long: it ends when the test says so.
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

        def publish() -> None:
            Effect.objects.create(task_key=args.key, token=claim.token, worker="holder")
            claim.complete("held")

        await claim.afenced(publish)
        emit(event="done", token=claim.token)
    except StaleClaim as exc:
        emit(event="stale", action=exc.action)


async def contend(args: argparse.Namespace) -> None:
    from django_taskclaim.models import Task

    stop = asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    emit(event="ready", pid=os.getpid())
    tries = wins = 0
    while not stop.done():
        outcome = await Task.objects.aclaim(args.key, lease=args.lease, owner=f"contender-{os.getpid()}")
        tries += 1
        wins += outcome.claimed
        await asyncio.sleep(0.05)
    emit(event="contended", tries=tries, wins=wins, at=time.time())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("gather", "hold", "contend"))
    parser.add_argument("key")
    parser.add_argument("--callers", type=int, default=10)
    parser.add_argument("--lease", type=float, default=5)
    parser.add_argument("--work", type=float, default=0.3)
    args = parser.parse_args()
    setup()

    async def run() -> None:
        from django.db import connections

        try:
            await {"gather": gather, "hold": hold, "contend": contend}[args.mode](args)
        finally:
            await sync_to_async(connections.close_all)()

    asyncio.run(run())


if __name__ == "__main__":
    main()
