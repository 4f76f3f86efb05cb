"""The database threads of a worker's event loop: where its async tasks' ORM calls run.

``sync_to_async`` (thread-sensitive, as every ``a*`` method of a claim and Django's own) runs every
call of an event loop on one thread by default: the claims, starts and completions of all the
async tasks a worker has in flight would wait for each other there, and one task's slow query
would hold up every other task's calls, past their timeouts. :class:`DbThreads` gives each async
task in flight a database thread of its own instead, with its own connection, for as long as the
task runs (:meth:`DbThreads.lane`): all of that task's thread-sensitive calls (the worker's, and
its body's own) go to it, so that they share one thread and one connection (one transaction
state), and wait for no other task's. A thread is handed to another task only once the call it
was running has returned (a task cancelled at its timeout leaves its query running there): a
task's deadline never depends on another task's database work. A worker of ``--concurrency N``
thus makes up to ``N`` database threads, each with a connection, but never more than
:data:`MOST` (``N`` of 500 would open 500 sessions, past a server's ``max_connections``): past
that many tasks in flight, a task shares the least used thread with other tasks (each task's calls
still on one thread), as every task of a loop did before. :meth:`DbThreads.close` closes each
thread's connections on that thread, then ends it.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import ParamSpec, TypeVar

from asgiref.sync import SyncToAsync, ThreadSensitiveContext
from django.db import connections

#: Whether this asgiref takes an executor for a thread-sensitive context (asgiref 3.13+); before,
#: the context's executor is set where asgiref looks it up (:class:`_LegacyContext`).
EXECUTOR_CONTEXTS = "executor" in inspect.signature(ThreadSensitiveContext).parameters

#: The most database threads (and so connections) one event loop's async tasks use: up to this
#: many tasks in flight each have one of their own; more share them (docs/django-tasks.md).
MOST = 32

P = ParamSpec("P")
T = TypeVar("T")


class DbThreads:
    """A database thread per async task in flight, each running one call at a time with its own
    connections; made on first use, and kept for the next task once free."""

    def __init__(self, most: int = MOST) -> None:
        self.most = most
        self.lock = threading.Lock()
        self.threads: list[_DbThread] = []  # every thread made, for close()
        self.idle: list[_DbThread] = []  # free: no task holds it and no call runs on it

    @asynccontextmanager
    async def lane(self) -> AsyncIterator[Executor]:
        """Run the block's thread-sensitive calls on a database thread no other task uses (its executor)."""
        with self.lock:
            if self.idle:
                thread = self.idle.pop()
            elif len(self.threads) < self.most:
                thread = _DbThread(self, f"taskclaim-async-db-{len(self.threads)}")
                self.threads.append(thread)
            else:  # as many threads as allowed, each held: share the least used one
                thread = min(self.threads, key=lambda t: (t.held, t.calls))
            thread.held += 1
        try:
            async with _context(thread):
                yield thread
        finally:
            with self.lock:
                thread.held -= 1
                self._free(thread)

    def returned(self, thread: _DbThread) -> None:
        """A call on ``thread`` returned (on that thread)."""
        with self.lock:
            thread.calls -= 1
            self._free(thread)

    def _free(self, thread: _DbThread) -> None:
        # Free once no task holds it and no call runs on it: a task cancelled at its timeout leaves
        # its statement running there, and a task given that thread would wait for it.
        if not thread.held and not thread.calls:
            self.idle.append(thread)

    def close(self) -> None:
        """Close each thread's connections on that thread, and end the threads (the tasks have ended;
        a call a cancelled task left running there is waited for)."""
        for thread in self.threads:
            thread.submit(connections.close_all).result()
            thread.shutdown()
        self.threads, self.idle = [], []


class _DbThread(ThreadPoolExecutor):
    """One database thread (an executor of one worker): counts the calls sent to it and not returned."""

    def __init__(self, owner: DbThreads, name: str) -> None:
        super().__init__(max_workers=1, thread_name_prefix=name)
        self.owner = owner
        self.held = 0  # the tasks whose lane uses it (under owner.lock)
        self.calls = 0  # calls submitted, not returned (under owner.lock)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        with self.owner.lock:
            self.calls += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self.owner.returned(self)
            raise
        future.add_done_callback(lambda _: self.owner.returned(self))
        return future


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
