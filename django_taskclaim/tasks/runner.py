"""The worker side of ``ClaimBackend``: run one claimed Django task by the execution protocol.

``manage.py taskclaim_worker --queue default`` (no handler) runs ``work(TaskRunner(alias))``:
each task its backend enqueued is imported by its path, called with its arguments (a
``TaskContext`` first when it takes one; coroutine functions through ``async_to_sync``, as the
framework's ``Task.call`` does), and ends by the protocol's rules: its JSON-normalised return
value stored, a failure retried after the task's backoff while attempts remain (the error and
its traceback kept on the attempt row), a dead worker's task taken over after its lease.
"""

from __future__ import annotations

import functools
import inspect
import logging
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.utils.dateparse import parse_datetime

from ..claims import Claim
from ..exceptions import InvalidArgument, InvalidResult, StaleClaim
from ..execution import FENCED_OFF, Executed, Finish, Policy, aexecute, error_text, execute, record_failure
from ..status import Status
from ..worker import Prepared, Runner
from .compat import TaskContext, TaskResultStatus, normalize_json, task_backends, task_finished, task_started
from .identity import options_of
from .results import STATUS, load_task, new_result, result_of

logger = logging.getLogger("django_taskclaim")

#: Seconds at most before a task this worker could not import may be handed out again.
IMPORT_RETRY_CAP = 60.0


class TaskRunner(Runner):
    """Runs the tasks of Django task backend ``alias`` (a ``ClaimBackend``)."""

    #: ``claim_next(path=...)``: only tasks that name the task that runs them.
    path = "*"

    def __init__(self, alias: str = "default") -> None:
        from .backend import ClaimBackend
        from .checks import refuse_unusable

        backend = task_backends[alias]
        if not isinstance(backend, ClaimBackend):
            raise TypeError(f"task backend {alias!r} is {type(backend).__name__}, not ClaimBackend")
        refuse_unusable(backend)  # its check's errors (E201…): never claim with what cannot run
        self.backend = backend
        self.lease = backend.lease_for(None)  # OPTIONS["LEASE"], else TASKCLAIM_DEFAULT_LEASE

    def describe(self) -> str:
        return f"Django tasks of backend {self.backend.alias!r}"

    @property
    def queues(self) -> list[str]:
        """The backend's ``QUEUES`` (``["default"]`` when it names none)."""
        return sorted(self.backend.queues) or ["default"]

    @functools.lru_cache(maxsize=1024)  # noqa: B019 - one runner per worker process
    def _task(self, path: str) -> Any:
        return load_task(path)

    @functools.lru_cache(maxsize=1024)  # noqa: B019
    def _policy(self, path: str) -> Policy:
        backoff = self.backend.backoff_for(self._task(path).func)
        return Policy(
            retry=True,  # while attempts remain: max_attempts was stored with the task
            # The framework records a task's SystemExit as its failure; KeyboardInterrupt
            # stops the worker (the claim is released).
            failures=(SystemExit,),
            error=_what_failed,
            delay=lambda claim, error: backoff.delay(claim.attempt),
        )

    @functools.lru_cache(maxsize=1024)  # noqa: B019
    def _own_lease(self, path: str) -> float | None:
        """The lease the task at ``path`` declares for itself (``None``: the worker's)."""
        return options_of(self._task(path).func).lease

    def is_async(self, claim: Claim) -> bool:
        """Whether the task is a coroutine function (one this worker cannot import runs the sync way)."""
        try:
            return inspect.iscoroutinefunction(self._task(claim.task_path).func)
        except Exception:
            return False

    def timeout_for(self, claim: Claim) -> float | None:
        """The task's ``claim_options(timeout=...)``, else the backend's ``OPTIONS["TIMEOUT"]``."""
        try:
            func = self._task(claim.task_path).func
        except Exception:
            return None
        return self.backend.timeout_for(func)

    def policy_for(self, claim: Claim) -> Policy:
        return self._policy(claim.task_path)

    def execute(self, claim: Claim, finish: Finish) -> Executed:
        try:
            task = self._task(claim.task_path)
        except Exception as exc:  # not importable here: a newer release's task, or one that is gone
            return self._not_importable(claim, exc)
        sender, result, call_args, kwargs, store = self._prepare(claim, task, finish)
        executed = execute(claim, task.call, call_args, kwargs, policy=self._policy(claim.task_path), finish=store)
        if not executed.fenced_off:  # fenced off: the attempt of the worker that took over reports it
            self._finished(sender, result, executed)
        return executed

    def prepare(self, claim: Claim, finish: Finish) -> Any:
        """What running a coroutine function task needs, made on the ORM thread (:meth:`_prepare`)."""
        return self._prepare(claim, self._task(claim.task_path), finish)  # importable: is_async() said so

    async def aexecute(self, claim: Claim, finish: Finish, prepared: Prepared | None = None) -> Executed:
        """:meth:`execute` for a coroutine function task, awaited on the caller's event loop."""
        task = self._task(claim.task_path)  # importable: is_async() said so
        if prepared is None:
            prepared = Prepared(await sync_to_async(self.prepare)(claim, finish), outer=None)
        sender, result, call_args, kwargs, store = prepared.value
        def finished(executed: Executed) -> None:  # on the ORM thread, in the call that ended the claim
            if not executed.fenced_off:
                self._finished(sender, result, executed)

        return await aexecute(claim, task.func, call_args, kwargs, policy=self._policy(claim.task_path),
                              finish=store, then=finished, outer=prepared.outer)

    def _prepare(self, claim: Claim, task: Any, finish: Finish) -> tuple[type, Any, tuple[Any, ...], dict[str, Any],
                                                                         Finish]:
        """What running ``task`` needs: its lease set, its result and ``task_started`` sent, its
        arguments, and how its return value is stored."""
        if (lease := self._own_lease(claim.task_path)) is not None and lease != claim.lease:
            claim.heartbeat(lease)  # the task's own lease, from now on
        payload = claim.payload or {}
        args, kwargs = list(payload.get("args", [])), dict(payload.get("kwargs", {}))
        result = self._running(claim, task, args, kwargs)
        call_args = (TaskContext(task_result=result), *args) if task.takes_context else tuple(args)
        sender = type(self.backend)
        task_started.send(sender, task_result=result)

        def store(held: Claim, value: Any) -> Any:
            try:
                value = normalize_json(value)
            except (TypeError, ValueError) as exc:
                raise InvalidResult(f"the task's return value is not JSON: {exc}") from exc
            return finish(held, value)

        return sender, result, call_args, kwargs, store

    def _not_importable(self, claim: Claim, error: Exception) -> Executed:
        """A task whose function this worker cannot import. During a rolling deploy a worker of the
        previous release meets the new release's tasks: within ``OPTIONS["IMPORT_GRACE"]`` of the
        task's enqueue it releases it, its attempt not counted and not due again for a
        while (a quarter of the time it has waited, 1 s to 60 s: a backoff with no state of its
        own), so that a worker that has the function runs it. Past the grace the function is gone
        (a typo, a task removed): the task ends FAILED with the import error."""
        row: Any = claim.row
        if row is None:
            from ..models import Task

            row = Task.objects.using(claim.using).get(pk=claim.task_id)
        # Both by the database clock: the claim's time, and the enqueue's (or its run_after).
        waited = (row.updated_at - _enqueued(row)).total_seconds()
        try:
            if waited >= self.backend.import_grace:
                return Executed(claim, record_failure(claim, error, retry=False), error=error)
            delay = min(IMPORT_RETRY_CAP, max(1.0, waited / 4))
            logger.warning("task %s cannot be imported here (%s): released, not before %.0f s", claim.task_path,
                           error, delay, extra=claim.log_extra())
            claim.release(delay=delay, reason=f"cannot be imported by worker {claim.owner}: {error_text(error)}")
        except StaleClaim as exc:
            return Executed(claim, FENCED_OFF, error=exc)
        return Executed(claim, Status.PENDING, error=error, released=True)

    def _running(self, claim: Claim, task: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """The task's result as it starts; on a first attempt built from the claimed row alone."""
        if claim.attempt == 1 and claim.row is not None:
            return new_result(task, claim.row, self.backend.alias, owner=claim.owner, using=claim.using)
        from ..models import Task

        row = Task.objects.using(claim.using).get(pk=claim.task_id)
        return result_of(row, self.backend._attempts(claim.task_id, claim.using), self.backend.alias, task)

    @staticmethod
    def _finished(sender: type, result: Any, executed: Executed) -> None:
        """``task_finished``, with the result as the attempt left it (its value read as every
        integration reads it: ``Executed.outcome()``); after a failure from inside the ``except``
        block, so that the framework's log receiver has the traceback."""
        status = STATUS[Status(executed.ending)]
        object.__setattr__(result, "status", status)
        try:
            value = executed.outcome()
        except BaseException:
            task_finished.send(sender, task_result=result)
            return
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", value)
        task_finished.send(sender, task_result=result)


def _enqueued(row: Any) -> datetime:
    """When a task was enqueued to run: its creation, or the ``run_after`` it was enqueued with."""
    run_after = (row.dispatch or {}).get("run_after")
    due = parse_datetime(run_after) if run_after else None
    return max(row.created_at, due) if due is not None else row.created_at


def _what_failed(error: BaseException) -> BaseException:
    """The error to record: a return value that is not JSON is the framework's TypeError."""
    if isinstance(error, InvalidResult) and isinstance(error.__cause__, TypeError | ValueError):
        return error.__cause__
    return error


def worker_runner(*, backend: str, queues: list[str] | None, lease: float | None,
                  atomic: bool) -> tuple[TaskRunner, list[str], float | None]:
    """``taskclaim_worker`` without a handler (registered in ``worker_runners.WORKER_RUNNERS``): the
    runner of Django task backend ``backend``, the queues to take (default: its ``QUEUES``), the
    lease. What the command must refuse raises ``InvalidArgument``, naming the problem."""
    if atomic:
        raise InvalidArgument("--atomic runs a handler inside fenced(); a Django task writes its own "
                              "effects inside current_claim().fenced()")
    try:
        runner = TaskRunner(backend)
    except Exception as exc:  # an alias not in TASKS, or another backend
        raise InvalidArgument(f"--backend {backend!r}: {exc}") from exc
    unknown = sorted(set(queues or ()) - set(runner.backend.queues)) if runner.backend.queues else []
    if unknown:
        raise InvalidArgument(f"queue(s) {unknown} are not in TASKS[{backend!r}]['QUEUES'] "
                              f"({sorted(runner.backend.queues)})")
    return runner, queues or runner.queues, lease
