"""The database threads of a worker's event loop: where its async tasks' ORM calls run.

``sync_to_async`` (thread-sensitive, as every ``a*`` method of a claim and Django's own) runs every
call of an event loop on one thread by default: the claims, starts and completions of all the
async tasks a worker has in flight would wait for each other there, one round trip at a time.
:class:`DbThreads` keeps a few threads instead, each with its own database connection, and runs
each async task inside :meth:`DbThreads.lane`: all of that task's thread-sensitive calls (the
worker's, and its body's own) go to one of them, the one with the fewest tasks, so that a task's
calls still share one thread and one connection (one transaction state), as they did before.
:meth:`DbThreads.close` closes each thread's connections on that thread, then ends it.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import asynccontextmanager

from asgiref.sync import SyncToAsync, ThreadSensitiveContext
from django.db import connections

#: Async tasks in flight per database thread, and the most threads a loop gets (connections).
TASKS_PER_THREAD, MOST_THREADS = 8, 8
#: Whether this asgiref takes an executor for a thread-sensitive context (asgiref 3.13+); before,
#: the context's executor is set where asgiref looks it up (:class:`_LegacyContext`).
EXECUTOR_CONTEXTS = "executor" in inspect.signature(ThreadSensitiveContext).parameters


def threads_for(concurrency: int, row_locks: bool) -> int:
    """How many database threads an event loop of ``concurrency`` tasks in flight gets: one per
    :data:`TASKS_PER_THREAD` tasks, :data:`MOST_THREADS` at most; one where the database has no row
    locks but one writer (SQLite), which would make more threads wait for each other's commits
    (and for its lock) rather than overlap."""
    if not row_locks:
        return 1
    return max(1, min(MOST_THREADS, concurrency // TASKS_PER_THREAD))


class DbThreads:
    """``count`` threads, each running one call at a time with its own connections; made on first use."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.executors: list[ThreadPoolExecutor] = []
        self.tasks: list[int] = []  # tasks in each thread's lane now (read and written on the loop only)

    @asynccontextmanager
    async def lane(self) -> AsyncIterator[int]:
        """Run the block's thread-sensitive calls on the database thread with the fewest tasks (its index)."""
        if not self.executors:
            self.executors = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"taskclaim-async-db-{i}")
                              for i in range(self.count)]
            self.tasks = [0] * self.count
        index = min(range(self.count), key=self.tasks.__getitem__)
        self.tasks[index] += 1
        try:
            async with _context(self.executors[index]):
                yield index
        finally:
            self.tasks[index] -= 1

    def close(self) -> None:
        """Close each thread's connections on that thread, and end the threads (the tasks have ended)."""
        for executor in self.executors:
            executor.submit(connections.close_all).result()
            executor.shutdown()
        self.executors = []


def _context(executor: Executor) -> ThreadSensitiveContext | _LegacyContext:
    return ThreadSensitiveContext(executor=executor) if EXECUTOR_CONTEXTS else _LegacyContext(executor)


class _LegacyContext:
    """``ThreadSensitiveContext(executor=...)`` for an asgiref that has no such argument: the context
    and its executor are set where ``SyncToAsync`` looks them up (as every asgiref since 3.3 does),
    and the executor is left running on exit (its owner ends it)."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.key = ThreadSensitiveContext()

    async def __aenter__(self) -> None:
        SyncToAsync.context_to_thread_executor[self.key] = self.executor
        self.token = SyncToAsync.thread_sensitive_context.set(self.key)

    async def __aexit__(self, *exc: object) -> None:
        SyncToAsync.thread_sensitive_context.reset(self.token)
        SyncToAsync.context_to_thread_executor.pop(self.key, None)
