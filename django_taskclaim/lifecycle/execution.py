"""Running work under a claim: the one protocol that ``run_once``, ``arun_once``, the queue
worker, the Django Tasks backend, the Celery bridge and LangGraph nodes share.

    claim ─▶ keepalive ─▶ body ─▶ the claim ends by the rules below ─▶ the caller's answer
      └ not claimed: the stored result, TaskFailed, TaskBusy, or wait and look again

How a body's end decides the claim's (:func:`conclude`, written once, sync; the async
:func:`aexecute` awaits the body and then runs the same function):

- **It returned**: the claim is completed with the result. A result that cannot be stored ends
  the task FAILED (``InvalidResult``): the work ran, it never runs again.
- **It ended the claim itself** (completed inside ``fenced()``, say): nothing more is written,
  if that ending committed. One that was rolled back with the transaction it was written in
  leaves the claim held, and the task goes back to PENDING to run again (the effect written
  with it rolled back too): ``EndingRolledBack``.
- **It raised**: the failure is recorded, back to PENDING while attempts remain when the
  policy retries it, and the error goes back to the caller. A shutdown or a cancellation
  (``BaseException`` that is not an ``Exception``), and the policy's ``release_on``
  exceptions, release the claim untouched.
- **It was fenced off** (a heartbeat or one of its own writes refused: another worker took
  over): nothing is written.

What the caller gets is read once, by :meth:`Executed.outcome`, for every integration: the
body's value (the result it stored, when it completed its claim itself), its error raised,
or — fenced off — :class:`FencedOff`: from then on the caller is a duplicate, and gets what a
duplicate delivery gets (the new owner's stored result, ``TaskFailed``, or the ``on_busy``
answer while the new owner runs). A shutdown or a cancellation reaches the caller whatever
came of the claim.

While the body runs, :func:`current_claim` returns its claim.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DataError, transaction

from ..conf import settings
from ..exceptions import InvalidResult, StaleClaim, TaskBusy, TaskClaimError, TaskFailed, TimedOut
from ..status import TERMINAL, Status
from .claim import Claim
from .transitions import in_transaction, task_model

logger = logging.getLogger("django_taskclaim")

#: How a duplicate delivery behaves while the task runs elsewhere: ``TaskBusy`` or wait.
ON_BUSY = ("raise", "wait")
#: :attr:`Executed.ending` of a claim that was fenced off: the task is no longer ours.
FENCED_OFF = "fenced_off"
#: :func:`answer`'s reply when the caller should wait for the owner and look again.
WAIT: Any = type("Wait", (), {"__repr__": lambda self: "WAIT"})()

_NOTHING: Any = type("Nothing", (), {"__repr__": lambda self: "<nothing>"})()
_current: contextvars.ContextVar[Claim] = contextvars.ContextVar("taskclaim_current_claim")
_NO_SCOPE = nullcontext()  # reusable: it holds no state


class EndingRolledBack(TaskClaimError):
    """The body ended its claim inside a transaction that was then rolled back."""


@dataclass(frozen=True)
class Policy:
    """How an integration's bodies end their claims."""

    #: Whether a failure goes back to PENDING while attempts remain (a bool, or a callable of
    #: the exception).
    retry: bool | Callable[[BaseException], bool] = True
    #: Exceptions that release the claim untouched (an interrupt: the work was put off, not
    #: failed). Shutdowns and cancellations always do.
    release_on: tuple[type[BaseException], ...] = ()
    #: Run the body and the completion in one ``claim.fenced()`` transaction: the body's
    #: writes commit with the completion, once, or not at all.
    atomic: bool = False
    #: What is recorded for a failure (default: the exception itself, as ``fail()`` words it).
    error: Callable[[BaseException], BaseException | str] | None = None
    #: ``BaseException``\ s (not ``Exception``\ s) that are the body's failure, not a shutdown
    #: (the Tasks framework records a task's ``SystemExit`` as its failure).
    failures: tuple[type[BaseException], ...] = ()
    #: Seconds before a failed task retried may run again, from the claim and the error;
    #: ``None`` leaves it to ``Claim.fail`` (a queued task: ``TASKCLAIM_RETRY_BACKOFF``).
    delay: Callable[[Claim, BaseException], float | None] | None = None

    def recorded(self, error: BaseException) -> BaseException | str:
        return self.error(error) if self.error is not None else error

    def gives_back(self, error: BaseException) -> bool:
        """Whether ``error`` releases the claim: a shutdown or cancellation, or a ``release_on`` one."""
        return isinstance(error, self.release_on) or self.stops(error)

    def stops(self, error: BaseException) -> bool:
        """Whether ``error`` is a shutdown or a cancellation (a ``BaseException`` that is not an
        ``Exception`` nor one of ``failures``): it reaches the caller, whatever came of the claim."""
        return not isinstance(error, Exception) and not isinstance(error, self.failures)

    def retry_delay(self, claim: Claim, error: BaseException) -> float | None:
        return None if self.delay is None else self.delay(claim, error)

    def retries(self, error: BaseException) -> bool:
        return self.retry(error) if callable(self.retry) else bool(self.retry)


DEFAULT = Policy()

#: ``finish(claim, result)``: how a returned result is stored; returns the claims it made
#: (a queue worker's ``complete_and_claim_next``), if any.
Finish = Callable[[Claim, Any], "list[Claim] | None"]


class FencedOff:
    """What :meth:`Executed.outcome` returns when the claim was fenced off (another owner took
    the task over, an operator released or cancelled it): from there on the caller is a duplicate."""

    def __init__(self, claim: Claim) -> None:
        self.claim = claim

    def __repr__(self) -> str:
        return f"FencedOff({self.claim!r})"


@dataclass
class Executed:
    """What one execution under a claim came to; :meth:`outcome` is how every integration reads it."""

    claim: Claim
    #: The task's status after it (``succeeded``, ``pending``, ``failed``), or ``FENCED_OFF``.
    ending: str
    #: What the body returned (nothing when it raised).
    value: Any = _NOTHING
    #: What the body raised, or what storing its result raised; ``None`` when it went through.
    error: BaseException | None = None
    #: Whether the body ended its claim itself (and that ending committed).
    by_body: bool = False
    #: The claims the completion made (``finish`` of a queue worker).
    next_claims: list[Claim] = field(default_factory=list)
    #: Whether the claim was released untouched (a shutdown, a ``release_on`` exception).
    released: bool = False
    #: Whether the body was stopped by a shutdown or a cancellation (``error``), released or fenced off.
    stopped: bool = False

    @property
    def returned(self) -> bool:
        return self.value is not _NOTHING

    @property
    def fenced_off(self) -> bool:
        """Whether the claim was fenced off: nothing of this execution was written."""
        return self.ending == FENCED_OFF

    @property
    def failure(self) -> BaseException | None:
        """The error this execution failed with, for a caller that only reports it (a queue
        worker): ``None`` when it went through, was fenced off or released its claim."""
        return None if self.fenced_off or self.released else self.error

    def outcome(self) -> Any:
        """The caller's answer, the one reading of an execution:

        - a shutdown or a cancellation: raised, whatever came of the claim;
        - fenced off: :class:`FencedOff` — from there on a duplicate (``run_by_key`` answers it
          as one: the new owner's stored result, ``TaskFailed``, or ``on_busy`` while it runs);
        - the body raised (or storing its result did): that error raised;
        - the body completed its claim itself: the result it stored, as every duplicate reads it;
        - otherwise the body's return value.
        """
        if self.stopped:
            raise self.error  # type: ignore[misc]
        if self.fenced_off:
            return FencedOff(self.claim)
        if self.error is not None:
            raise self.error
        if self.by_body and self.ending == Status.SUCCEEDED:
            return self.claim.completed_with
        return self.value


def current_claim() -> Claim:
    """The claim of the body running in this context (thread or asyncio task)."""
    try:
        return _current.get()
    except LookupError:
        raise TaskClaimError(
            "current_claim() is only available inside a body running under a claim: run_once, a queue "
            "worker's handler, a Django task, a claimed Celery task or a LangGraph node") from None


def current_claim_or_none() -> Claim | None:
    return _current.get(None)


@contextmanager
def _running(claim: Claim) -> Iterator[None]:
    token = _current.set(claim)
    try:
        yield
    finally:
        _current.reset(token)


# -- running a body ------------------------------------------------------------------------
def execute(
    claim: Claim, func: Callable[..., Any], args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None, *,
    policy: Policy = DEFAULT, finish: Finish | None = None,
) -> Executed:
    """Run ``func(*args, **kwargs)`` under ``claim`` with keepalive; end the claim by the rules."""
    value, raised, storing, made = _NOTHING, None, False, None
    rolled_back = claim._rolled_back
    current = _current.set(claim)  # what _running() does, without a generator: once a task
    try:
        inside = in_transaction(claim.using)
        with claim._keepalive(inside), _scope(claim, policy, inside):
            value = func(*args, **(kwargs or {}))
            if policy.atomic and claim._ended is None:  # the completion commits with the body's writes
                storing = True
                made = (finish or _complete)(claim, value)
    except BaseException as exc:
        raised = exc
    finally:
        _current.reset(current)
    if storing and raised is None:
        return Executed(claim, claim.ended() or Status.SUCCEEDED, value, next_claims=made or [])
    return conclude(claim, value, raised, policy=policy, finish=finish, storing=storing, rolled_back=rolled_back)


async def aexecute(
    claim: Claim, afunc: Callable[..., Awaitable[Any]], args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None, *, policy: Policy = DEFAULT, finish: Finish | None = None,
    then: Callable[[Executed], None] | None = None, outer: bool | None = None,
) -> Executed:
    """:func:`execute` for a coroutine function: ``akeepalive`` around it, then the same rules.

    Django has no async transactions: ``policy.atomic`` is refused, and a body inside a
    caller's transaction gets no savepoint of its own. ``then(executed)``: sync work to do once the
    claim has ended, on the ORM thread in the same call as the ending (one hop to it, not two).
    ``outer``: whether the ORM thread is inside a transaction, when the caller has just asked it
    there (``None``: the keepalive asks, one more call on that thread).
    """
    if policy.atomic:
        raise ValueError("an atomic policy needs a sync body: Django's transactions cannot span awaits")
    value, raised = _NOTHING, None
    rolled_back = claim._rolled_back
    with _running(claim):
        try:
            async with claim._akeepalive(None, outer):
                value = await afunc(*args, **(kwargs or {}))
        except BaseException as exc:
            raised = exc

    def end() -> Executed:
        executed = conclude(claim, value, raised, policy=policy, finish=finish, rolled_back=rolled_back)
        if then is not None:
            then(executed)
        return executed

    return await sync_to_async(end)()


def _scope(claim: Claim, policy: Policy, inside: bool) -> AbstractContextManager[Any]:
    """What the body runs in; ``inside``: whether the claim's connection is in a transaction."""
    if policy.atomic:
        return claim.fenced()
    # Inside a transaction a database error in the body would abort it (PostgreSQL), and then
    # recording the failure would fail too, hiding the original error: run the body in a
    # savepoint, so its rollback leaves the transaction usable.
    return transaction.atomic(using=claim.using) if inside else _NO_SCOPE


def conclude(
    claim: Claim, value: Any = _NOTHING, raised: BaseException | None = None, *, policy: Policy = DEFAULT,
    finish: Finish | None = None, storing: bool = False, rolled_back: int | None = None,
) -> Executed:
    """End ``claim`` after its body returned ``value`` or raised ``raised``: the one rule.

    ``storing``: ``raised`` came from storing the result (inside the atomic block), not from
    the body. ``rolled_back``: the claim's count of rolled-back endings before the body ran.
    A body may call it itself to end its claim by the rule now (the Celery bridge's
    ``retry()``, before Celery publishes the retry): ``conclude(claim, raised=error, policy=...)``.
    """
    executed = _conclude(claim, value, raised, policy, finish, storing, rolled_back)
    executed.stopped = _shutdown(claim, raised, policy)
    return executed


def _shutdown(claim: Claim, raised: BaseException | None, policy: Policy) -> bool:
    """Whether ``raised`` stops the caller (a shutdown; not a cancellation by the body's timeout)."""
    return raised is not None and policy.stops(raised) and not _cancelled_by_its_timeout(claim, raised)


def _cancelled_by_its_timeout(claim: Claim, raised: BaseException) -> bool:
    """An async body cancelled because its timeout fenced it off: the attempt's ending (recorded
    as ``TimedOut``), not a shutdown of the worker."""
    return isinstance(raised, asyncio.CancelledError) and isinstance(claim.lost_reason, TimedOut)


def _conclude(
    claim: Claim, value: Any, raised: BaseException | None, policy: Policy, finish: Finish | None,
    storing: bool, rolled_back: int | None,
) -> Executed:
    if rolled_back is None:
        rolled_back = claim._rolled_back
    try:
        if (isinstance(claim.lost_reason, TimedOut) and not _shutdown(claim, raised, policy)
                and (timed_out := claim.ended()) is not None):
            # The attempt ran past its timeout, whose write ended it (failed, or retried): that is
            # its error, whatever the body did after (returned, met StaleClaim, was cancelled), and
            # what a log of its failure names.
            return Executed(claim, timed_out, value, claim.lost_reason)
        if isinstance(raised, StaleClaim):
            return Executed(claim, FENCED_OFF, value, raised)
        ended = claim.ended()
        if raised is not None:
            if ended is not None:  # the body ended its claim, then raised: nothing more to write
                return Executed(claim, ended, value, raised, by_body=True)
            if storing and isinstance(raised, InvalidResult | DataError):
                return Executed(claim, record_failure(claim, policy.recorded(raised), retry=False), value, raised)
            if policy.gives_back(raised):
                return Executed(claim, _release(claim), value, raised, released=True)
            retry = policy.retries(raised)
            status = record_failure(claim, policy.recorded(raised), retry=retry,
                                    delay=policy.retry_delay(claim, raised) if retry else None)
            return Executed(claim, status, value, raised)
        if ended is not None:
            return Executed(claim, ended, value, by_body=True)
        if claim._rolled_back != rolled_back:
            error = EndingRolledBack(
                f"task {claim.key!r} (tenant {claim.tenant!r}): the body ended its claim inside a transaction "
                "that was then rolled back, with whatever it wrote there; the task will run again")
            return Executed(claim, record_failure(claim, error, retry=True), value, error)
        try:
            made = _store(claim, value, finish or _complete, policy)
        except InvalidResult as exc:
            return Executed(claim, Status.FAILED, value, exc)
        return Executed(claim, Status.SUCCEEDED, value, next_claims=made or [])
    except StaleClaim as exc:  # fenced off while recording the end: the body's error, if any, stays the news
        return Executed(claim, FENCED_OFF, value, raised or exc)


def _complete(claim: Claim, value: Any) -> None:
    claim.complete(value)


def complete_or_fail(claim: Claim, result: Any = None, result_ref: str = "") -> None:
    """Complete ``claim`` for work that already ran; a result that cannot be stored ends it FAILED.

    ``complete()`` alone leaves the task RUNNING when it refuses a result, and the next claim
    after the lease would run the work a second time. Here the refusal is recorded as the
    final failure (the error names the problem) and ``InvalidResult`` propagates; a later call
    finds the task FAILED.
    """
    _store(claim, result, lambda c, value: c.complete(value, result_ref))


def _store(claim: Claim, value: Any, finish: Finish, policy: Policy = DEFAULT) -> list[Claim] | None:
    try:
        return finish(claim, value)
    except InvalidResult as exc:
        record_failure(claim, policy.recorded(exc), retry=False)
        raise
    except DataError as exc:
        # Something the checks before the write did not foresee; inside a transaction the
        # database has aborted it, and the caller's rollback decides.
        if in_transaction(claim.using):
            raise
        record_failure(claim, exc, retry=False)
        raise InvalidResult(f"the database refused the result: {exc}") from exc


def record_failure(claim: Claim, error: BaseException | str, *, retry: bool, delay: float | None = None) -> str:
    """``claim.fail(error, retry=..., delay=...)``; a refusal (fenced off) is logged here and raised."""
    try:
        return claim.fail(error, retry=retry, delay=delay)
    except StaleClaim:
        logger.warning("failure of a fenced-off claim not recorded: %s", claim.named(), extra=claim.log_extra())
        raise


def _release(claim: Claim) -> str:
    claim.release()
    return Status.PENDING


# -- answering a duplicate ------------------------------------------------------------------
def answer(task: Any, on_busy: str) -> Any:
    """What a caller that did not claim ``task`` gets: its stored result, ``TaskFailed``,
    ``TaskBusy`` (``on_busy="raise"``), or ``WAIT`` to wait for the owner and look again."""
    if task.status == Status.SUCCEEDED:
        return task.result
    if task.status in (Status.FAILED, Status.CANCELLED):
        raise TaskFailed(task)
    if on_busy == "raise" and task.status == Status.RUNNING:
        raise TaskBusy(task)
    return WAIT


def check_on_busy(on_busy: str) -> str:
    if on_busy not in ON_BUSY:
        raise ValueError(f"on_busy must be one of {ON_BUSY}, not {on_busy!r}")
    return on_busy


def _live(task: Any) -> Any:
    return task_model().objects.using(task._state.db).filter(pk=task.pk)


def wait_while_busy(task: Any) -> Any:
    """Poll until no live lease holds the task; its state then (``None`` if purged)."""
    tasks = _live(task)
    while True:
        time.sleep(settings.POLL_INTERVAL)  # polling the database is the point here
        if not tasks.live().exists():
            return tasks.first()


async def await_while_busy(task: Any) -> Any:
    """:func:`wait_while_busy` with ``asyncio.sleep``, so one event loop holds many waiters."""
    tasks = _live(task)
    while True:
        await asyncio.sleep(settings.POLL_INTERVAL)
        if not await tasks.live().aexists():
            return await tasks.afirst()


def answered(ran: Any) -> Any:
    """``ran``, a run step's answer (``Executed.outcome()``), for a caller with no claim loop of
    its own (``run_claimed``): a claim fenced off is answered as a duplicate with
    ``on_busy="raise"`` would be — the new owner's stored result, ``TaskFailed``, ``TaskBusy``
    while it runs — and with ``StaleClaim`` when nobody holds the task (released, reclaimed,
    purged: this call cannot claim it again)."""
    return _as_duplicate(ran.claim, _task_or_none(ran.claim)) if isinstance(ran, FencedOff) else ran


async def aanswered(ran: Any) -> Any:
    """:func:`answered` for async callers (``arun_claimed``)."""
    if not isinstance(ran, FencedOff):
        return ran
    return _as_duplicate(ran.claim, await sync_to_async(_task_or_none)(ran.claim))


def _as_duplicate(claim: Claim, task: Any) -> Any:
    reply = WAIT if task is None else answer(task, "raise")
    if reply is WAIT:
        raise StaleClaim(claim.key, claim.tenant, claim.token, "run")
    return reply


def _task_or_none(claim: Claim) -> Any:
    return task_model().objects.using(claim.using).filter(pk=claim.task_id).first()


# -- by key: claim, or answer a duplicate -----------------------------------------------------
# The steps the drivers below perform: claim, run a claim, read a fenced-off claim's task, wait.
_CLAIM = object()


def _by_key(on_busy: str | Callable[[Any], Any]) -> Generator[Any, Any, Any]:
    """The decisions of running work by key, as steps for a sync or an async driver to carry out.

    Claim; a claim runs, and its answer is the caller's (``Executed.outcome()``). Not claimed,
    or fenced off while it ran (a duplicate from then on, whatever the body did): the
    stored outcome, or, while another worker holds the task, ``on_busy`` (``"raise"``,
    ``"wait"``, or a callable of the task returning ``WAIT`` or raising). A task found
    finished after waiting is answered without another claim (one duplicate row per waiter).
    """
    task = None
    while True:
        if task is None or task.status not in TERMINAL:
            outcome = yield _CLAIM
            if outcome.claim is None:
                task = outcome.task
            else:
                ran = yield outcome.claim
                if not isinstance(ran, FencedOff):
                    return ran
                task = yield ran  # from here on a duplicate: read the task a newer owner holds now
                if task is None:
                    continue  # purged meanwhile: claim it afresh
        reply = answer(task, "wait" if callable(on_busy) else on_busy)
        if reply is not WAIT:
            return reply
        if task.status == Status.PENDING:
            continue  # released or reclaimed meanwhile: claim it
        if callable(on_busy) and (reply := on_busy(task)) is not WAIT:
            return reply
        task = yield task  # wait while busy
        if task is None:
            continue  # purged while we waited: claim it afresh


def _performer(
    claim_call: Callable[[], Any], run: Callable[[Claim], Any], read: Callable[[Claim], Any],
    wait: Callable[[Any], Any],
) -> Callable[[Any], Any]:
    """Carry out one step of :func:`_by_key` (or start it: an awaitable, for the async driver)."""

    def perform(step: Any) -> Any:
        if step is _CLAIM:
            return claim_call()
        if isinstance(step, Claim):
            return run(step)
        if isinstance(step, FencedOff):
            return read(step.claim)
        return wait(step)

    return perform


def run_by_key(
    claim_call: Callable[[], Any], run: Callable[[Claim], Any], on_busy: str | Callable[[Any], Any] = "raise",
) -> Any:
    """Drive :func:`_by_key` with sync calls: ``claim_call()`` claims, ``run(claim)`` runs one."""
    steps, perform = _by_key(on_busy), _performer(claim_call, run, _task_or_none, wait_while_busy)
    try:
        step = next(steps)
        while True:
            step = steps.send(perform(step))
    except StopIteration as done:
        return done.value


async def arun_by_key(
    claim_call: Callable[[], Awaitable[Any]], run: Callable[[Claim], Awaitable[Any]],
    on_busy: str | Callable[[Any], Any] = "raise",
) -> Any:
    """:func:`run_by_key` with awaitables: the same steps, the same decisions."""
    steps, perform = _by_key(on_busy), _performer(claim_call, run, sync_to_async(_task_or_none), await_while_busy)
    try:
        step = next(steps)
        while True:
            step = steps.send(await perform(step))
    except StopIteration as done:
        return done.value

