"""A queue worker: claim the next tasks, run a handler on each, store its result.

The loop costs one commit per task: the completion of a task and the claim of the next are
one statement (:meth:`Claim.complete_and_claim_next`). Each handler runs by the execution
protocol (:mod:`django_taskclaim.lifecycle.execution`): under ``keepalive()``; an exception is
recorded with ``retry=True`` (the task comes back while attempts remain); a result that
cannot be stored ends its task FAILED, never running it again; a claim fenced off meanwhile
(its lease expired and another worker took over) stores nothing. A handler may end its
claim itself (publish its work and complete it in one ``claim.fenced()`` block of its own,
say): the worker then stores nothing more, and counts what committed. A dropped database
connection is survived: the statement runs again on a new one, and a database out of reach
leaves the claim in hand to run out (the task comes back after its lease).

    from django_taskclaim.worker import work

    def handle(claim):               # claim.key, claim.tenant, claim.payload
        return render_report(claim.payload)

    work(handle, lease=60, batch=10, stop=stop_event)

or ``manage.py taskclaim_worker myapp.jobs.handle``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.db import InterfaceError, OperationalError, close_old_connections, connections

from . import outages, routing
from .conf import settings
from .exceptions import InvalidArgument, StaleClaim, TimedOut
from .lifecycle.api import claim_next, default_owner
from .lifecycle.claim import Claim, reservation
from .lifecycle.deadlines import watch
from .lifecycle.execution import FENCED_OFF, Executed, Finish, Policy, aexecute, execute
from .lifecycle.transitions import in_transaction
from .models import Task
from .status import Status
from .values import DEFAULT_QUEUE, lease_seconds, positive_int, queue_names, timeout_seconds
from .wakeups import wait_for_work
from .worker_pool import Pool, Spares

logger = logging.getLogger("django_taskclaim")

Handler = Callable[[Claim], Any]
#: The database cannot be reached (a restart, a failover): the worker waits and tries again.
_UNREACHABLE = (OperationalError, InterfaceError)
_counting = threading.Lock()
#: ``work(until_drained=DUE)``: drained once no task is due now or running; deferred ones do not count.
DUE = "due"
#: Seconds the claimer wakes after a spare turns stale (:func:`_until_stale`), so that it finds it so.
STALE_MARGIN = 0.01
#: :func:`default_batch`'s cap: the batch the no-op drain was measured at (docs/benchmarks.md).
MOST_BATCH = 16


@dataclass
class WorkerStats:
    """What one :func:`work` call did."""

    succeeded: int = 0
    failed: int = 0
    fenced_off: int = 0
    #: Tasks whose end could not be written (the database out of reach): back after their lease.
    unrecorded: int = 0
    #: Tasks released unrun and uncharged (a Django task this worker cannot import yet).
    released: int = 0
    #: Attempts that ran past their timeout: fenced off then, recorded as failed with ``TimedOut``.
    timed_out: int = 0
    #: Attempts that failed with attempts left: their task went back to PENDING to run again (and is
    #: counted once, ``succeeded`` or ``failed``, by the attempt that ends it). Not tasks: attempts.
    retried: int = 0

    @property
    def handled(self) -> int:
        """Attempts run to an end, each counted once (a task retried counts once per attempt)."""
        return self.succeeded + self.failed + self.fenced_off + self.unrecorded + self.timed_out + self.retried

    def count(self, executed: Executed) -> None:
        """Count a task by what committed: its end as written, by the handler or the worker."""
        if executed.released:
            self.add("released")
        elif executed.ending == Status.SUCCEEDED:
            self.add("succeeded")
        elif isinstance(executed.claim.lost_reason, TimedOut) or (
                executed.ending == FENCED_OFF and executed.claim.overran()):
            # Whatever the body's own ending met after the fencing. A write that fenced() refused
            # because the timeout had passed (its own check before COMMIT) may come before the
            # deadline thread has recorded the TimedOut: past its timeout, the attempt timed out.
            self.add("timed_out")
        elif executed.ending == FENCED_OFF:
            self.add("fenced_off")
        elif executed.ending == Status.PENDING:
            self.add("retried")  # an attempt failed, not the task: it runs again
        else:
            self.add("failed")

    def add(self, outcome: str) -> None:
        """One more task of ``outcome`` (the lanes of one worker count together)."""
        with _counting:
            setattr(self, outcome, getattr(self, outcome) + 1)


@dataclass(frozen=True)
class Prepared:
    """What a coroutine task's :meth:`Runner.prepare` made on the ORM thread, and whether that thread
    was inside a transaction then (what its keepalive would otherwise cross to that thread to ask;
    ``None``: not asked)."""

    value: Any
    outer: bool | None


class Runner:
    """How a worker runs one claimed task. A plain handler runs under the execution protocol
    (:class:`HandlerRunner`); a subclass may know more about the task it is given (the Django
    Tasks backend's ``TaskRunner`` imports the task its row names)."""

    #: ``claim_next(path=...)``: ``""`` takes work for a handler (tasks that name no callable),
    #: ``"*"`` tasks that name the callable that runs them.
    path = ""
    #: The lease its claims take when ``work()`` is given none (``None``: ``TASKCLAIM_DEFAULT_LEASE``).
    lease: float | None = None

    def execute(self, claim: Claim, finish: Finish) -> Executed:
        raise NotImplementedError

    async def aexecute(self, claim: Claim, finish: Finish, prepared: Prepared | None = None) -> Executed:
        """:meth:`execute` for a task whose body is a coroutine function (:meth:`is_async`).
        ``prepared``: what :meth:`prepare` made of it on the ORM thread (``None``: not done yet)."""
        raise NotImplementedError

    def prepare(self, claim: Claim, finish: Finish) -> Any:
        """The sync work :meth:`aexecute` does on the ORM thread before the body (nothing here): the
        worker does it in the one call that starts the claim, so as to cross to that thread once."""
        return None

    def is_async(self, claim: Claim) -> bool:
        """Whether ``claim``'s body is a coroutine function: run by :meth:`aexecute` on an event loop."""
        return False

    def timeout_for(self, claim: Claim) -> float | None:
        """Seconds an attempt of ``claim``'s task may run before its claim is fenced off (its own
        timeout; ``None``: the worker's ``timeout``, if any)."""
        return None

    def policy_for(self, claim: Claim) -> Policy:
        """How a failure of ``claim``'s task is recorded (a timeout's: retried or not, after what delay)."""
        return Policy()

    def describe(self) -> str:
        """What this runner runs, for the worker's start-up line."""
        return type(self).__name__


class HandlerRunner(Runner):
    """``handler(claim)`` under the execution protocol (``atomic``: inside ``claim.fenced()``); a
    coroutine function ``handler`` is awaited (never atomic: Django's transactions cannot span awaits)."""

    def __init__(self, handler: Handler, *, atomic: bool = False) -> None:
        self.handler, self.policy = handler, Policy(atomic=atomic)
        self.coroutine = inspect.iscoroutinefunction(handler)
        if self.coroutine and atomic:
            raise InvalidArgument("atomic=True runs the handler inside claim.fenced(), a transaction that cannot "
                             "span awaits: an async handler writes its effects with claim.afenced()")

    def execute(self, claim: Claim, finish: Finish) -> Executed:
        return execute(claim, self.handler, (claim,), policy=self.policy, finish=finish)

    async def aexecute(self, claim: Claim, finish: Finish, prepared: Prepared | None = None) -> Executed:
        return await aexecute(claim, self.handler, (claim,), policy=self.policy, finish=finish,
                              outer=None if prepared is None else prepared.outer)

    def is_async(self, claim: Claim) -> bool:
        return self.coroutine

    def policy_for(self, claim: Claim) -> Policy:
        return self.policy

    def describe(self) -> str:
        name = getattr(self.handler, "__qualname__", None) or repr(self.handler)
        module = getattr(self.handler, "__module__", None)
        return f"handler {module}.{name}" if module else f"handler {name}"


def work(
    handler: Handler | Runner, *, owner: str | None = None, lease: float | timedelta | None = None,
    tenant: str | None = None, queue: str | Sequence[str] = DEFAULT_QUEUE, batch: int | None = None,
    poll: float | None = None, max_tasks: int | None = None, until_drained: bool | str = False, atomic: bool = False,
    stop: threading.Event | None = None, using: str | None = None, concurrency: int = 1,
    timeout: float | timedelta | None = None, hard_timeout_grace: float | None = None,
    on_stuck: Callable[[], object] | None = None,
) -> WorkerStats:
    """Run ``handler(claim)`` on the tasks queued in ``queue`` (one name or several) until
    ``stop`` is set (or idle, or ``max_tasks``).

    ``handler`` may also be a :class:`Runner` (the Django Tasks backend's ``TaskRunner``).
    ``batch`` tasks are claimed at a time; the last completion of a batch claims the next one
    (default: 1, and with ``concurrency`` N, :func:`default_batch`: min(N, 16)).
    A claim that waited its turn until less than two thirds of its lease may be left (counted
    from before the claim was sent, not from when the call returned) is renewed before its
    handler runs, and skipped, counted as fenced off, if another worker took it over meanwhile.
    ``until_drained`` stops once no task is unfinished (one held by another worker may come back),
    deferred ones too (a task whose "not before" time is an hour ahead is waited for);
    ``until_drained="due"`` stops once none is due: pending and due now, or running (held elsewhere,
    it may come back), leaving the deferred ones for a later run.
    With no task to claim the worker waits ``poll`` seconds (``TASKCLAIM_POLL_INTERVAL``).
    ``atomic=True`` runs each handler inside ``claim.fenced()`` and completes it there: its
    database writes commit with the completion, once, or not at all.

    ``concurrency``: up to that many tasks in flight at once (:mod:`django_taskclaim.worker_pool`):
    sync bodies each on a thread of its own, coroutine functions on one event loop. Free slots are
    filled by claims of at most ``batch`` tasks each, every task started as it gets its slot; a
    slot whose task ends starts its next one (a spare claim held ready) in the same commit.
    ``timeout``: seconds an attempt may run (unless its task says otherwise) before its claim is
    fenced off and the attempt recorded as failed with ``TimedOut`` (:mod:`~django_taskclaim.lifecycle.deadlines`):
    an async body is cancelled, a sync one runs on harmlessly, holding its slot until it returns.
    ``hard_timeout_grace`` (with ``on_stuck``; ``taskclaim_worker --processes`` passes them): a sync
    body still running that many seconds past its timeout is stuck: the worker stops claiming, its
    spare claims are released uncharged, its other tasks in flight have ``hard_timeout_grace`` more
    seconds to finish, then ``on_stuck()`` is called, which ends the process (a supervisor starts
    another; :class:`_HardLimit`).

    Over several task databases (no ``tenant``, no ``using``) each database is served by a thread
    of its own (a *lane*: its own connection, its claims, handlers and completions, one task at a
    time), so that a database that is down or hung (a server stopped with SIGSTOP answers nothing,
    and no socket timeout fires) holds up only its own tenants' tasks.
    """
    runner = handler if isinstance(handler, Runner) else HandlerRunner(handler, atomic=atomic)
    seconds = lease_seconds(runner.lease if lease is None else lease)
    positive_int(concurrency, "concurrency")
    batch = default_batch(concurrency) if batch is None else batch
    positive_int(batch, "batch")
    seconds_max = None if timeout is None else timeout_seconds(timeout, "timeout")
    if max_tasks is not None:
        positive_int(max_tasks, "max_tasks")
    if (hard_timeout_grace is None) != (on_stuck is None):
        raise InvalidArgument("hard_timeout_grace and on_stuck go together: what to do with a stuck worker")
    if hard_timeout_grace is not None:
        timeout_seconds(hard_timeout_grace, "hard_timeout_grace")
    if until_drained not in (False, True, DUE):
        raise InvalidArgument(f"until_drained must be True, False or {DUE!r}, not {until_drained!r}")
    job = _Job(runner=runner, owner=owner or default_owner(), lease=seconds, tenant=tenant, queues=queue_names(queue),
               batch=batch, wait=settings.POLL_INTERVAL if poll is None else poll, until_drained=until_drained,
               stop=stop or threading.Event(), budget=_Budget(max_tasks), concurrency=concurrency,
               timeout=seconds_max)
    if on_stuck is not None and hard_timeout_grace is not None:
        job.hard = _HardLimit(hard_timeout_grace, on_stuck, job.stop)
    _log_start(runner, job.owner, job.queues, tenant, using, seconds, batch, concurrency)
    lanes = routing.databases(using) if tenant is None else ()
    try:
        if len(lanes) < 2:
            _serve(job, using, routing.route(tenant, using) if tenant is not None else routing.databases(using)[0])
        else:
            _serve_lanes(job, lanes)
    finally:
        if job.hard is not None:
            job.hard.close()
    return job.stats


def default_batch(concurrency: int) -> int:
    """The most tasks one claim takes when the caller names no ``batch``: 1 for one task at a time
    (a batch's later tasks would wait, reserved, for the ones before them), and with several slots
    as many as there are, 16 at most. A worker with slots claims only what its free slots take at
    once (each task started as it gets its slot), so a larger batch holds nothing back from other
    workers: it only saves the claimer a statement per task when several slots free together."""
    return 1 if concurrency == 1 else min(concurrency, MOST_BATCH)


@dataclass
class _Budget:
    """What is left of ``max_tasks`` (``None``: no limit), shared by the lanes. A claim takes its room
    before it is sent and holds it while it is in flight (:meth:`take`); :meth:`settle` then keeps
    what it claimed and gives the rest back. Only claims made spend the budget: a lane that finds
    nothing left while another lane holds some waits for that claim's answer rather than stop, since
    the other may claim nothing (its database empty) and give it all back."""

    left: int | None
    #: Room taken by claims in flight, not yet settled.
    held: int = 0
    #: Lanes waiting in :meth:`take` for a claim in flight to settle.
    waiting: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)

    def take(self, wanted: int, wait: float = 0.0) -> int:
        """Room for up to ``wanted`` claims, held until :meth:`settle`. With none left but some held by
        a claim in flight, wait up to ``wait`` seconds for it to settle first."""
        with self.changed:
            if self.left is None:
                return wanted
            if wait > 0 and not self.left and self.held:
                self.waiting += 1
                try:
                    self.changed.wait_for(lambda: self.left or not self.held, wait)
                finally:
                    self.waiting -= 1
            granted = min(wanted, self.left)
            self.left -= granted
            self.held += granted
            return granted

    def settle(self, taken: int, used: int) -> None:
        """A claim that held ``taken`` made ``used`` claims: those are spent, the rest is given back."""
        with self.changed:
            if self.left is not None:
                self.held -= taken
                self.left += taken - used
                self.changed.notify_all()

    def refund(self, unused: int) -> None:
        """Give back tasks claimed and then released unrun (spares)."""
        with self.changed:
            if self.left is not None:
                self.left += unused
                self.changed.notify_all()

    def spent(self) -> bool:
        """Whether ``max_tasks`` tasks were claimed: nothing left, and no claim in flight may give any back."""
        with self.changed:
            return self.left == 0 and not self.held


@dataclass
class _Job:
    """One :func:`work` call: what its lanes share."""

    runner: Runner
    owner: str
    lease: float
    tenant: str | None
    queues: list[str]
    batch: int
    wait: float
    #: ``False``, ``True`` (no task unfinished) or :data:`DUE` (none due or running).
    until_drained: bool | str
    stop: threading.Event
    budget: _Budget
    concurrency: int = 1
    #: The worker's ``timeout`` (seconds), for tasks that set none of their own.
    timeout: float | None = None
    stats: WorkerStats = field(default_factory=lambda: WorkerStats())
    #: ``work(hard_timeout_grace=...)``: what gives up a worker whose sync task is stuck.
    hard: _HardLimit | None = None


class _HardLimit:
    """A sync body cannot be stopped: past its timeout it is fenced off (its attempt recorded as
    failed with ``TimedOut``) but keeps its thread and its slot. This gives such a worker up: once
    a sync body has run ``grace`` seconds past its timeout, the worker stops claiming (its spare
    claims released uncharged), what else it has in flight gets ``grace`` more seconds to end, and
    then ``on_stuck()`` ends the process, the stuck thread with it (a supervisor starts another).

    What is in flight is counted in *units*: each loop that claims (a lane's), and each pool slot
    from the moment its claim is handed over until the slot ends (a task started by the claim or by
    the completion before it is in a unit before its body runs, so it is never left behind)."""

    def __init__(self, grace: float, on_stuck: Callable[[], object], stop: threading.Event) -> None:
        self.grace, self.on_stuck, self.stop = grace, on_stuck, stop
        self.changed = threading.Condition(threading.Lock())
        self.units: set[_Unit] = set()
        self.watcher: threading.Thread | None = None
        self.closed = False

    def enter(self) -> _Unit:
        """One more thing in flight (a claiming loop, a slot), until :meth:`_Unit.leave`."""
        unit = _Unit(self)
        with self.changed:
            self.units.add(unit)
        return unit

    def close(self) -> None:
        """The worker returned: its watcher thread ends (it gives nothing up any more)."""
        with self.changed:
            self.closed = True
            self.changed.notify_all()

    def _stuck(self) -> int:
        now = time.monotonic()
        return sum(1 for unit in self.units if unit.stuck_at is not None and unit.stuck_at <= now)

    def _watch(self) -> None:
        with self.changed:
            while not self._stuck():
                if self.closed:
                    return
                due = [unit.stuck_at for unit in self.units if unit.stuck_at is not None]
                self.changed.wait(max(0.0, min(due) - time.monotonic()) if due else None)
            stuck = self._stuck()
        logger.warning("a sync task ran %g s past its timeout (fenced off then): this worker stops claiming, "
                       "gives its other tasks %g s to finish, then exits to be replaced", self.grace, self.grace,
                       extra={"grace": self.grace, "stuck": stuck})
        self.stop.set()  # nothing more is claimed or started; spares are released
        with self.changed:  # what can end, ends (the claiming loops too); the stuck ones never will
            self.changed.wait_for(lambda: len(self.units) <= self._stuck(), self.grace)
            left = len(self.units) - self._stuck()
        if left:
            logger.warning("%d task(s) or loop(s) still running after %g s: their tasks are left to their leases",
                           left, self.grace, extra={"grace": self.grace})
        self.on_stuck()


class _Unit:
    """One thing in flight under a :class:`_HardLimit`; ``stuck_at`` (monotonic) while a sync
    attempt with a timeout runs in it: when it counts as stuck."""

    __slots__ = ("limit", "stuck_at")

    def __init__(self, limit: _HardLimit) -> None:
        self.limit = limit
        self.stuck_at: float | None = None

    def leave(self) -> None:
        limit = self.limit
        with limit.changed:
            limit.units.discard(self)
            limit.changed.notify_all()

    @contextmanager
    def attempt(self, timeout: float) -> Iterator[None]:
        """While a sync body with ``timeout`` runs here."""
        limit = self.limit
        with limit.changed:
            self.stuck_at = time.monotonic() + timeout + limit.grace
            if limit.watcher is None:
                limit.watcher = threading.Thread(target=limit._watch, name="taskclaim-hard-timeout", daemon=True)
                limit.watcher.start()
            limit.changed.notify_all()
        try:
            yield
        finally:
            with limit.changed:
                self.stuck_at = None
                limit.changed.notify_all()


def _enter(job: _Job) -> _Unit | None:
    return None if job.hard is None else job.hard.enter()


def _leave(unit: _Unit | None) -> None:
    if unit is not None:
        unit.leave()


def _serve_lanes(job: _Job, aliases: Sequence[str]) -> None:
    """One lane per task database, until each ends; the first error of a lane stops them all and is
    raised once they ended (a shutdown, whose claim is released; an unexpected error)."""
    errors: list[BaseException] = []

    def lane(alias: str) -> None:
        try:
            _serve(job, alias, alias)
        except BaseException as exc:
            errors.append(exc)
            job.stop.set()
        finally:
            connections.close_all()  # this lane's connections

    threads = [threading.Thread(target=lane, args=(alias,), name=f"taskclaim-lane-{alias}") for alias in aliases]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except BaseException:  # interrupted (KeyboardInterrupt): each lane ends after its task in hand
        job.stop.set()
        for thread in threads:
            thread.join()
        raise
    if errors:
        raise errors[0]


def _serve(job: _Job, using: str | None, alias: str) -> None:
    """The worker's loop on database ``using`` (``alias``, for what is said about it being down);
    ``using=None`` with a tenant: the tenant's database. One task at a time; several with
    ``concurrency`` (:func:`_serve_pool`)."""
    if job.concurrency > 1:
        _serve_pool(job, using, alias)
        return
    runner, stats, stop = job.runner, job.stats, job.stop
    claims: list[Claim] = []
    previous: Claim | None = None  # the task run last, whose ending may have started the next
    unit = _enter(job)
    try:
        while not stop.is_set():
            if not claims:
                close_old_connections()
                room = job.budget.take(job.batch, wait=job.wait)
                if not room:
                    if job.budget.spent():
                        break  # max_tasks claimed, by this lane or others
                    continue  # the rest is held by another lane's claim in flight, which may give it back
                try:
                    # Reserving: only the first task of a batch starts (counts an attempt) now, each
                    # next one in the commit that ends the task before it. A task that kills this
                    # worker is the only one charged for it; its batch-mates come back soon.
                    claims = claim_next(job.owner, job.lease, job.tenant, room, queue=job.queues,
                                        path=runner.path, using=using, reserve=True)
                    outages.up(alias)
                    drained = not claims and bool(job.until_drained) and _drained(job, using)
                except _UNREACHABLE as exc:
                    outages.down(alias, exc)  # said once per change, not on every poll
                    drained = False
                job.budget.settle(room, len(claims))
                if drained:
                    break
                if not claims:
                    wait_for_work(alias, job.queues, job.wait, stop)  # woken early by an enqueue (PostgreSQL)
                    continue
            claim = claims.pop(0)
            if _started(claim, previous, stats) and _still_ours(claim, stats):
                more = 0 if claims or stop.is_set() else job.budget.take(job.batch)
                claim.then_start(claims[0] if claims and not stop.is_set() else None)
                previous = claim
                done = _run(runner, claim, stats, _finisher(more, job.tenant, job.queues, runner.path), job.timeout,
                            unit)
                job.budget.settle(more, len(done))
                claims += done
            if job.budget.spent() and not claims:
                break
    finally:  # stopped (or interrupted) with claims in hand: release them untouched
        try:
            _release_all(claims, previous)
        finally:
            _leave(unit)


def _serve_pool(job: _Job, using: str | None, alias: str) -> None:
    """:func:`_serve` with up to ``job.concurrency`` tasks in flight: one claimer (this thread) fills
    the free slots, at most ``job.batch`` tasks a statement, reserving all but the first; each task
    starts (its attempt counted) as it takes its slot, at once, so a reservation is never held
    longer than that. It also keeps a few reserved claims ready (:class:`Spares`) for the slots
    whose task is ending: such a slot's completion starts its next task in the same commit, and
    the slot runs it. Stopped: nothing more is claimed, and the tasks in flight finish."""
    # Each claim goes to its slot with its unit of the hard limit (if any), entered here, before the
    # hand-over, and left when the slot ends.
    pool = Pool(job.concurrency, run=lambda item: _slot(job, item[0], spares, item[1]),
                arun=lambda item: _aslot(job, item[0], spares, item[1]),
                is_async=lambda item: job.runner.is_async(item[0]))
    claimer = _enter(job)
    spares = Spares(job.batch, pool.nudge)
    stop, runner = job.stop, job.runner
    try:
        while not stop.is_set() and not pool.errors:
            _release_spares(spares, job.budget, keep=_fresh)
            free = pool.free()
            for claim in spares.give(free):  # a slot that freed with no spare to take: one now
                pool.submit((claim, _enter(job)))
                free -= 1
            wanted = free + spares.wanted()
            if not wanted:
                pool.wait(_until_stale(spares, job.wait))  # until a task in flight returns, or a spare is taken
                continue
            close_old_connections()
            room = job.budget.take(min(wanted, job.batch), wait=job.wait if free else 0.0)
            if not room:
                if free and job.budget.spent():
                    break  # max_tasks claimed, by this lane or others
                if not free:
                    pool.wait(_until_stale(spares, job.wait))
                continue  # or the rest is held by another lane's claim in flight, which may give it back
            claims, drained = [], False
            try:
                claims = claim_next(job.owner, job.lease, job.tenant, room, queue=job.queues, path=runner.path,
                                    using=using, reserve=True)
                outages.up(alias)
                drained = (not claims and bool(job.until_drained) and pool.free() == job.concurrency
                           and _drained(job, using))
            except _UNREACHABLE as exc:
                outages.down(alias, exc)
            job.budget.settle(room, len(claims))
            for claim in claims[:free]:
                pool.submit((claim, _enter(job)))
            spares.put(claims[free:])
            if drained:
                break
            if not claims:  # nothing to claim, for a free slot or a spare: until an enqueue (PostgreSQL) or a poll
                wait_for_work(alias, job.queues, _until_stale(spares, job.wait), stop)
    except BaseException:  # interrupted (KeyboardInterrupt): the tasks in flight end, nothing more starts
        stop.set()
        raise
    finally:
        if stop.is_set():  # stopped, no slot takes a spare: give them back now, not after the tasks in flight
            _release_spares(spares, job.budget)
        _leave(claimer)
        try:
            pool.close()
        finally:
            _release_spares(spares, job.budget)


def _fresh(spare: Claim) -> bool:
    """Whether a spare claim has been held less than half its reservation: one held longer sits in a
    pool whose slots free too seldom to use it, and is released (uncharged) for other workers."""
    return _fresh_for(spare) > 0


def _fresh_for(spare: Claim) -> float:
    """Seconds until a spare claim has been held half its reservation (:func:`_fresh`: no longer,
    then), by what is left of what it was claimed for: its reservation, or its lease when it was
    the first task of its claim, started by it (claimed while no slot was free)."""
    held_for = reservation(spare.lease) if spare.reserved else spare.lease
    return spare.remaining() - (held_for - reservation(spare.lease) / 2)


def _until_stale(spares: Spares, wait: float) -> float:
    """How long the claimer may wait: ``wait`` seconds, or less, until the first spare it holds is
    no longer :func:`_fresh` (its check runs when the claimer wakes: a longer wait held a spare past
    the bound, 5.8 s where half its reservation is 2.5 s)."""
    soonest = spares.soonest(_fresh_for)
    return wait if soonest is None else min(wait, max(0.0, soonest) + STALE_MARGIN)


def _release_spares(spares: Spares, budget: _Budget, keep: Callable[[Claim], bool] = lambda claim: False) -> None:
    """Release the spare claims ``keep`` refuses (all by default) uncharged, for other workers, and
    refund them to ``max_tasks``."""
    for claim in spares.remove(keep):
        budget.refund(1)
        _release_unstarted(claim)


class _Successor:
    """What a slot's completion hands over: a spare claim, taken once as the result is stored,
    started by the same commit (:meth:`Claim.then_start`). For a coroutine body (``eager``) the
    spare is also begun there (:func:`_begin`), on the ORM thread the completion already runs on:
    one crossing to that thread per task saved."""

    def __init__(self, job: _Job, spares: Spares | None, *, eager: bool = False) -> None:
        self.job, self.spares, self.eager = job, spares, eager
        self.claim: Claim | None = None
        self.asked = False
        #: Set when the completion began the spare: what :func:`_begin` returned, or raised.
        self.begun: tuple[Prepared | None, BaseException | None] | None = None
        self.next: _Successor | None = None

    def finish(self, claim: Claim, result: Any) -> None:
        if self.spares is None or self.asked or self.job.stop.is_set():
            claim.complete(result)
            return
        self.asked = True
        self.claim = self.spares.take()
        claim.then_start(self.claim)
        claim.complete(result)
        if self.eager and self.claim is not None:
            self.next = _Successor(self.job, self.spares, eager=True)
            try:
                self.begun = (_begin(self.job, self.claim, self.next.finish, claim), None)
            except BaseException as exc:  # raised by the slot, not as this task's failure to store
                self.begun = (None, exc)


def _slot(job: _Job, claim: Claim, spares: Spares | None = None, unit: _Unit | None = None) -> None:
    """Sync tasks in one slot: ``claim``'s started now (a reserved one released instead when the
    worker is stopping), then run, counted; then the spare its completion started, if any. Each
    lease is renewed with the other tasks in flight, one statement a round for all
    (:mod:`~django_taskclaim.lifecycle.renewal`)."""
    try:
        _slot_tasks(job, claim, spares, unit)
    finally:
        _leave(unit)


def _slot_tasks(job: _Job, claim: Claim, spares: Spares | None, unit: _Unit | None) -> None:
    previous: Claim | None = None
    current: Claim | None = claim
    while current is not None:
        current.renew_together = True
        if job.stop.is_set() and current.reserved and current.started_by(previous) is None:
            _release_unstarted(current)
            return
        if not _started(current, previous, job.stats):
            return
        successor = _Successor(job, spares)
        try:
            _run(job.runner, current, job.stats, successor.finish, job.timeout, unit)
        except BaseException:  # a shutdown: the spare its completion took is released, uncharged
            if successor.claim is not None:
                _release_all([successor.claim], current)
            raise
        previous, current = current, successor.claim


async def _aslot(job: _Job, claim: Claim, spares: Spares | None = None, unit: _Unit | None = None) -> None:
    """:func:`_slot` for a coroutine body, on the pool's event loop (its ORM calls on one of the pool's
    database threads)."""
    try:
        await _aslot_tasks(job, claim, spares)
    finally:
        _leave(unit)


async def _aslot_tasks(job: _Job, claim: Claim, spares: Spares | None) -> None:
    previous: Claim | None = None
    current: Claim | None = claim
    successor = _Successor(job, spares, eager=True)
    begun: tuple[Prepared | None, BaseException | None] | None = None
    while current is not None:
        current.renew_together = True
        if begun is None and job.stop.is_set() and current.reserved and current.started_by(previous) is None:
            await sync_to_async(_release_unstarted)(current)
            return
        try:
            if begun is None:
                prepared = await sync_to_async(_begin)(job, current, successor.finish, previous)
            elif begun[1] is not None:
                raise begun[1]
            else:
                prepared = begun[0]
            if prepared is None:
                return  # taken over before it started: counted as fenced off
            executed = await _aexecute(job.runner, current, successor.finish,
                                       _timeout(job.runner, current, job.timeout), prepared)
        except _UNREACHABLE as exc:
            _unrecorded(current, job.stats, exc)
            executed = None
        try:
            if executed is not None:
                _counted(executed, job.stats)
        except BaseException:  # a shutdown: the spare its completion took is released, uncharged
            if successor.claim is not None:
                await sync_to_async(_release_all)([successor.claim], current)
            raise
        previous, current, begun = current, successor.claim, successor.begun
        successor = successor.next or _Successor(job, spares, eager=True)


def _begin(job: _Job, claim: Claim, finish: Finish, previous: Claim | None = None) -> Prepared | None:
    """On the ORM thread, in one call: start a reserved claim (``None`` if it was taken over), then
    the runner's :meth:`~Runner.prepare`, and whether the thread is in a transaction."""
    if not _started(claim, previous, job.stats):
        return None
    return Prepared(job.runner.prepare(claim, finish), in_transaction(claim.using))


def _release_unstarted(claim: Claim) -> None:
    """Release a reserved claim unrun: its attempt count unchanged."""
    with suppress(StaleClaim, *_UNREACHABLE):
        claim.release()


def _release_all(claims: list[Claim], previous: Claim | None) -> None:
    """Release the claims a stopping worker holds and did not run; the first may have been started
    by the ending of ``previous`` (then its release uncounts the attempt that start counted)."""
    for left in claims:
        if left.started_by(previous) is False:
            continue  # taken over meanwhile, or its start is not known: not ours to release
        previous = None
        with suppress(StaleClaim, *_UNREACHABLE):
            left.release()


def _started(claim: Claim, previous: Claim | None, stats: WorkerStats) -> bool:
    """Whether ``claim`` has started and may run: started by the claim that took it, by the
    ending of the task run before it, or now (one statement). A reserved claim that another
    worker took over meanwhile (its reservation ran out) is skipped, counted as fenced off."""
    started = claim.started_by(previous)
    if started is None:
        try:
            claim.start()
            return True
        except StaleClaim:
            started = False
        except _UNREACHABLE as exc:
            # Whether the start committed is not known: never run it, never count it twice. The
            # claim runs out (its reservation, or its lease if it started) and comes back.
            logger.warning("a task could not be started: %s", exc, extra=claim.log_extra())
            started = False
    if not started:
        stats.add("fenced_off")
    return started


def _log_start(runner: Runner, owner: str, queues: list[str], tenant: str | None, using: str | None, lease: float,
               batch: int, concurrency: int = 1) -> None:
    """The worker's one start-up line: what it runs, from which queues and databases, how."""
    aliases = [routing.route(tenant, using)] if tenant is not None else list(routing.databases(using))
    whose = "" if tenant is None else f"; tenant {tenant!r}"
    at_once = "one task at a time" if concurrency == 1 else f"up to {concurrency} tasks at once"
    logger.info("worker %r started: %s, queues %s; databases %s%s; lease %gs; batch %d (%s)",
                owner, runner.describe(), ", ".join(queues), ", ".join(aliases), whose, lease, batch, at_once,
                extra={"owner": owner, "runner": runner.describe(), "queues": queues, "databases": aliases,
                       "tenant": tenant, "lease": lease, "batch": batch, "concurrency": concurrency})


def _run(runner: Runner, claim: Claim, stats: WorkerStats, finish: Finish, timeout: float | None = None,
         unit: _Unit | None = None) -> list[Claim]:
    """Run one task by the execution protocol (an async one on an event loop of its own, here; each
    under its timeout, a sync one also under the hard limit of ``unit``, if any); the claims its
    completion made."""
    try:
        seconds = _timeout(runner, claim, timeout)
        if runner.is_async(claim):
            executed = async_to_sync(_aexecute)(runner, claim, finish, seconds)
        elif seconds is None:
            executed = runner.execute(claim, finish)
        else:
            with unit.attempt(seconds) if unit is not None else nullcontext(), \
                    watch(claim, seconds, runner.policy_for(claim)):
                executed = runner.execute(claim, finish)
    except _UNREACHABLE as exc:
        return _unrecorded(claim, stats, exc)
    return _counted(executed, stats)


def _unrecorded(claim: Claim, stats: WorkerStats, exc: BaseException) -> list[Claim]:
    # Not even a new connection could record the end: the claim runs out and the task
    # comes back after its lease, by the rules.
    logger.warning("the end of a task could not be recorded: %s: %s", claim.named(), exc, extra=claim.log_extra())
    stats.add("unrecorded")
    return []


def _timeout(runner: Runner, claim: Claim, timeout: float | None) -> float | None:
    own = runner.timeout_for(claim)
    return timeout if own is None else own


async def _aexecute(runner: Runner, claim: Claim, finish: Finish, seconds: float | None,
                    prepared: Prepared | None = None) -> Executed:
    """Await ``claim``'s coroutine body; past ``seconds`` its claim is fenced off, then the body cancelled."""
    task, loop = asyncio.current_task(), asyncio.get_running_loop()
    cancel = None if task is None else (lambda: loop.call_soon_threadsafe(task.cancel))
    try:
        with watch(claim, seconds, runner.policy_for(claim), cancel):
            return await runner.aexecute(claim, finish, prepared)
    except asyncio.CancelledError:
        if not isinstance(claim.lost_reason, TimedOut):
            raise  # not our cancellation: a shutdown
        # Cancelled after its body had returned: the timeout's fencing is the attempt's end.
        return Executed(claim, claim.ended() or FENCED_OFF, error=claim.lost_reason)


def _counted(executed: Executed, stats: WorkerStats) -> list[Claim]:
    """Count a task by how it ended; the claims its completion made. A shutdown is raised."""
    claim = executed.claim
    stats.count(executed)
    if executed.stopped:
        raise executed.error  # type: ignore[misc]  # a shutdown: the claim is back (or taken over), the worker stops
    if executed.failure is not None:  # fenced off: counted, never the task's failure
        logger.warning("task handler failed: %s", claim.named(), exc_info=executed.failure, extra=claim.log_extra())
    return executed.next_claims


def _finisher(more: int, tenant: str | None, queues: list[str], path: str) -> Finish:
    """How a result is stored: with the next claims in the same statement when ``more`` are wanted,
    reserving all but the first of them, as the worker's own claims do (only a task that started
    pays for a death)."""
    if not more:
        return lambda claim, result: claim.complete(result)
    return lambda claim, result: claim.complete_and_claim_next(result, limit=more, tenant=tenant, queue=queues,
                                                               path=path, reserve=True)


def _still_ours(claim: Claim, stats: WorkerStats) -> bool:
    """Whether a claim of a batch may run now: one with less than two thirds of its lease left
    (by the claim's own clock, from before it was sent) is renewed first, so that a task whose
    lease ran out meanwhile (and that another worker may have taken over) is never run here too."""
    if claim.remaining() >= claim.lease * 2 / 3:
        return True
    try:
        claim.heartbeat()
    except StaleClaim:
        stats.add("fenced_off")
        return False
    return True


def _drained(job: _Job, using: str | None) -> bool:
    """Whether ``until_drained`` is met: no task left unfinished (with :data:`DUE`: none due or running)."""
    return not _unfinished(job.tenant, job.queues, job.runner.path, using, due=job.until_drained == DUE)


def _unfinished(tenant: str | None, queues: list[str], path: str, using: str | None, due: bool = False) -> bool:
    """Whether any task of these queues (of ``tenant``) is still pending or running, in any task
    database the worker covers: held elsewhere, it may come back. Tasks claimed by key and other
    kinds of work do not count; with ``due``, nor do pending tasks deferred to a later time."""
    aliases = (routing.route(tenant, using),) if tenant is not None else routing.databases(using)
    for alias in aliases:
        tasks = Task.objects.db_manager(alias).unfinished().queued(queues, path)
        if due:
            tasks = tasks.filter(status=Status.RUNNING) | tasks.due()
        if (tasks.filter(tenant=tenant) if tenant is not None else tasks).exists():
            return True
    return False
