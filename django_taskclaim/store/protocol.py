"""What the lifecycle asks of a database: every task transition as one named, guarded operation.

The lifecycle passes intent (a token, a result, a lease in seconds), never SQL; a store turns
it into its vendor's statements. Every owner write is guarded by ``status = 'running' AND
fencing_token = <token>`` and reports a refusal as ``None``/``False``, never as an exception.
Methods take a cursor of the task database that the store made (:meth:`Store.cursor`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol

from django.core.checks import CheckMessage

from .epochs import EpochState
from .rows import Claimed, Found, Moved, NewTask, Start, StepRow, TaskRow


class Store(Protocol):
    #: Django's ``connection.vendor`` this store serves.
    vendor: str
    #: SQL for the database clock (``statement_timestamp()``, ``UTC_TIMESTAMP(6)``…).
    now: str
    #: Whether a multi-statement operation must run inside one transaction the caller opens.
    needs_transaction: bool
    #: Whether the database locks rows (so ``row_free`` can tell a held row from a free one).
    row_locks: bool
    #: Whether a claim by key reads the task first (:meth:`read_state`) and claims only a task it
    #: may take: where the claim's write would wait for the row's holder (an owner inside
    #: ``fenced()``: MySQL's row lock, SQLite's one writer), so that a duplicate never waits.
    looks_first: bool

    # -- set-up ----------------------------------------------------------------------------
    def cursor(self, db: Any) -> Any:
        """A cursor on Django connection ``db`` for this store's statements (a ``CursorWrapper``)."""

    def system_check(self, alias: str, connection: Any) -> list[CheckMessage]:
        """The system check of database ``alias`` (Django connection ``connection``) for this store:
        a server too old, settings that break claims. Runs with every ``manage.py check``: it
        reads the settings and at most the server's version, never the tables."""

    def server_check(self, alias: str, connection: Any) -> list[CheckMessage]:
        """What only a query to the server tells (MySQL: E023, the task tables' columns): run where
        Django asks for the database checks of ``alias`` (``check --database``, ``migrate``)."""

    def shifted_now(self, seconds: float) -> tuple[str, list[Any]]:
        """SQL and parameters for the database clock plus ``seconds`` (negative: the past)."""

    def estimated_rows(self, cursor: Any, table: str) -> int | None:
        """The database's own estimate of ``table``'s rows (PostgreSQL's planner statistics), without
        counting them; ``None`` where the database keeps none or has not estimated yet."""

    def to_datetime(self, value: Any) -> datetime | None:
        """A datetime column's value as an aware datetime."""

    def read_only(self, db: Any, cursor: Any) -> AbstractContextManager[None] | str:
        """Around one statement that a ``fenced()`` block sends to Django connection ``db`` (another
        database than the block's, on driver cursor ``cursor``): the database itself refuses any
        write in it, whatever its text (a leading comment, a function that writes), and once the
        statement ended nothing of the setting is left on the session, for its next statement or
        the next user of the connection (a pool, PgBouncer in transaction mode). Where the database
        cannot do that now, a sentence saying why (the caller then sends nothing)."""

    def refused_write(self, error: BaseException) -> bool:
        """Whether the driver's ``error`` is the database refusing a write under :meth:`read_only`."""

    def begin_write(self, cursor: Any) -> None:
        """First statement of a transaction that reads before it writes: take the write lock."""

    def join_callers_transaction(self, db: Any) -> None:
        """Autocommit off and no transaction open yet: open the caller's transaction now."""

    def retryable(self, error: Exception) -> bool:
        """Whether ``error`` rolled back the whole transaction and it may simply run again (a deadlock)."""

    def limit_lock_waits(self, cursor: Any, seconds: float | None) -> None:
        """Inside a transaction: wait at most ``seconds`` for a row lock until it ends.

        Transaction-local where the database allows it (PostgreSQL); elsewhere the setting is
        made on the session of the keepalive thread's own connection, which is closed after use
        (``None`` restores the default)."""

    # -- claims ----------------------------------------------------------------------------
    def claim_key(
        self, cursor: Any, *, tenant: str, key: str, owner: str, lease: float, payload: str | None,
        fingerprint: str, max_attempts: int, delivery_id: str, audit: bool, in_transaction: bool = False,
        exists: bool | None = None,
    ) -> Claimed | Found | None:
        """Claim ``(tenant, key)``: create it RUNNING, take a pending one, or take over an expired lease.

        ``exists``: what a read just before found (``looks_first``): no task (``False``), a task
        it may claim (``True``), or nothing read (``None``).

        ``None`` when nothing was claimed (the lifecycle then calls :meth:`read_state`). A store
        that reads the task in the same statement may answer a duplicate delivery at once: a
        ``Found`` whose duplicate is recorded as :meth:`read_state` would have.
        """

    def read_state(
        self, cursor: Any, *, tenant: str, key: str, owner: str, fingerprint: str, delivery_id: str,
        audit: bool, in_transaction: bool,
    ) -> Found | None:
        """The task as it is (``None``: absent), recording a duplicate delivery: after a claim took
        nothing, or before it (``looks_first``). Never waits for a transaction holding the task:
        where the audit row would (MySQL's foreign key, SQLite's write lock), it is left out."""

    def claim_next(
        self, cursor: Any, *, owner: str, lease: float, tenant: str | None, limit: int,
        delivery_id: str, audit: bool, queues: Sequence[str], path: str, reserve: float | None = None,
    ) -> tuple[list[Claimed], list[Moved]]:
        """Queue style: up to ``limit`` tasks of ``queues`` (and of ``path``: ``""`` work for a
        handler, ``"*"`` tasks naming their callable), expired leases first, then the due
        pending ones, the highest priority first, then the oldest. Never a task claimed by key.
        Expired tasks on their last attempt end FAILED in the same unit of work (as reclaim
        would): ``(claimed, exhausted)``. With ``reserve`` (seconds) and more than one task, only
        the first to run (``in_claim_order``) is started; the others are reserved (``Claimed.reserved``:
        attempt count unchanged, no attempt row, a lease of ``reserve`` seconds)."""

    def ensure(
        self, cursor: Any, *, tenant: str, key: str, payload: str | None, fingerprint: str,
        max_attempts: int, dispatch: str | None, queue: str | None = None, priority: int = 0,
        run_after: datetime | None = None, task_path: str = "",
    ) -> TaskRow | None:
        """Insert a PENDING task unless ``(tenant, key)`` exists; the new row, or ``None``."""

    def set_limit(self, cursor: Any, task_id: int, concurrency_key: str, concurrency_limit: int) -> None:
        """Give the task ``task_id``, just inserted in ``cursor``'s transaction, its concurrency limit.
        Every queue claim (``claim_next``, its reserving form, ``complete_and_claim_next``) then keeps
        at most ``concurrency_limit`` tasks of ``concurrency_key`` RUNNING, deciding it in its own
        transaction so that racing claims never overshoot; a full key's tasks are passed over."""

    def ensure_many(self, cursor: Any, tasks: Sequence[NewTask]) -> list[TaskRow | None]:
        """:meth:`ensure` for many tasks, one multi-row insert per chunk (of up to 1,000 rows) on
        ``cursor``'s transaction: for each task, in order, its new row, or ``None`` where its
        ``(tenant, key)`` exists (already, or named by an earlier task of ``tasks``)."""

    def coalesce(
        self, cursor: Any, *, tenant: str, group: str, key: str, payload: str | None, fingerprint: str,
        max_attempts: int, dispatch: str | None, queue: str, priority: int, task_path: str, delay: float,
        max_delay: float | None,
    ) -> tuple[TaskRow, bool]:
        """Inside a transaction the caller opened: the group's waiting task (pending, never started:
        ``attempts = 0``)
        given ``payload`` and "not before" now + ``delay`` capped at its creation + ``max_delay``,
        or a new queued task (``key``, not before now + ``delay``) that becomes the group's latest.
        ``(row, created)``. Atomic across processes: the group's row is locked to the commit, and
        the waiting task is taken only by a write whose guard the database re-checks on the row."""

    def read_task(self, cursor: Any, *, tenant: str, key: str) -> TaskRow | None:
        """The task ``(tenant, key)``, or ``None``."""

    def read_tasks(self, cursor: Any, keys: Sequence[tuple[str, str]]) -> list[TaskRow]:
        """The tasks of these ``(tenant, key)`` pairs that exist, in no particular order."""

    def adopt_payload(self, cursor: Any, task_id: int, payload: str | None, fingerprint: str) -> None:
        """Store a payload on a task created without one (and only then)."""

    # -- an owner's writes, fenced by its token ---------------------------------------------
    def heartbeat(self, cursor: Any, task_id: int, token: int, lease: float) -> datetime | None:
        """Extend the lease from the database clock; the new expiry, or ``None`` if fenced off."""

    def heartbeat_many(self, cursor: Any, held: Sequence[tuple[int, int]], lease: float) -> dict[int, datetime]:
        """Renew every ``(id, token)`` of ``held`` still RUNNING under that token, in one statement per
        round: ``{id: new expiry}`` of those renewed (the others were fenced off)."""

    def start(self, cursor: Any, start: Start, audit: bool) -> datetime | None:
        """A reserved claim starts: attempt count + 1, its attempt row opened, the full lease from
        now, in one unit of work; the new expiry, or ``None`` if the token no longer owns the task."""

    def unreserve(self, cursor: Any, task_id: int, token: int) -> str | None:
        """A reserved claim (never started) back to PENDING, its attempt count unchanged; ``None`` if fenced off."""

    def complete(
        self, cursor: Any, task_id: int, token: int, result: str | None, result_ref: str, audit: bool,
        start: Start | None = None,
    ) -> str | None:
        """RUNNING -> SUCCEEDED with the (JSON-encoded) result; the new status or ``None``.
        ``start`` (also of ``fail`` and ``release``): a reserved claim started in the same commit
        when the ending matched (its ``tried`` and ``expires`` set), the next task of a batch."""

    def complete_and_claim_next(
        self, cursor: Any, task_id: int, token: int, result: str | None, result_ref: str, *, owner: str,
        lease: float, tenant: str | None, limit: int, delivery_id: str, audit: bool, queues: Sequence[str],
        path: str, reserve: float | None = None,
    ) -> tuple[str | None, list[Claimed], list[Moved]]:
        """:meth:`complete`, then (only if it matched) :meth:`claim_next`, in one commit: a queue
        worker's loop costs one commit per task. ``(None, [], [])`` if fenced off."""

    def fail(
        self, cursor: Any, task_id: int, token: int, error: str, retry: bool, audit: bool, *,
        error_class: str = "", traceback: str = "", delay: float | None = None, start: Start | None = None,
    ) -> str | None:
        """RUNNING -> PENDING (``retry`` and attempts left, not before ``delay`` seconds from now
        when given) or FAILED; the attempt keeps the error, its class and traceback. The new
        status or ``None``."""

    def release(self, cursor: Any, task_id: int, token: int, audit: bool, start: Start | None = None,
                delay: float | None = None, reason: str | None = None) -> str | None:
        """RUNNING -> PENDING, the attempt not counted; ``"pending"`` or ``None``. ``delay``: not
        claimed by a queue claim again before that many seconds; ``reason``: stored as the task's error."""

    def lock(self, cursor: Any, task_id: int, token: int) -> bool:
        """Inside a transaction: lock the task row if ``token`` still owns it."""

    def check(self, cursor: Any, task_id: int, token: int) -> bool:
        """Whether ``token`` still owns the task."""

    def row_free(self, cursor: Any, task_id: int) -> int | None:
        """The task's token if no transaction holds its row now; ``None`` if one does (or it is gone)."""

    def record_stale(self, cursor: Any, task_id: int, token: int) -> None:
        """Count a fenced-off write on the attempt that made it."""

    # -- durable steps ----------------------------------------------------------------------
    def read_steps(self, cursor: Any, task_id: int, token: int) -> dict[str, StepRow] | None:
        """The task's stored steps by name, read in one statement only while ``token`` still owns
        the task; ``None`` when it does not (the claim was fenced off)."""

    def store_step(self, cursor: Any, task_id: int, token: int, name: str, result: str) -> bool:
        """Store step ``name``'s result (JSON text) under the task, in one statement guarded by the
        token: whether it was stored. Nothing is stored when ``token`` no longer owns the task, nor
        when a step of that name is stored already (the first stored result stands). A takeover
        that commits while this runs is seen (the task row is read under a share lock)."""

    def read_step(self, cursor: Any, task_id: int, name: str) -> StepRow | None:
        """One stored step of the task, or ``None``."""

    # -- the sweeper and operators ---------------------------------------------------------
    def requeue(self, cursor: Any, task_id: int, dispatch: str, *, token: int | None,
                older_than: float | None) -> bool:
        """A pending task whose message is about to be sent again: store ``dispatch`` (JSON) and move
        ``updated_at`` to now, only while it is still pending with ``token`` (a task the sweeper just
        reclaimed) or, without a token, last updated more than ``older_than`` seconds ago by the
        database clock. Whether it matched: two sweepers never send one task twice in a round."""

    def reclaim(self, cursor: Any, limit: int | None, audit: bool) -> list[Moved]:
        """Expired RUNNING tasks to PENDING (FAILED with no attempts left)."""

    def fail_exhausted(self, cursor: Any, task_id: int, token: int, audit: bool) -> bool:
        """A task whose lease expired on its last attempt to FAILED; whether it moved."""

    def force_release(self, cursor: Any, held: Sequence[tuple[int, int]], audit: bool) -> list[Moved]:
        """RUNNING tasks ``(id, token)`` back to PENDING as a release would; its owner is fenced off."""

    def cancel(self, cursor: Any, ids: Sequence[int], audit: bool) -> int:
        """Unfinished tasks to CANCELLED (a running owner is fenced off); how many moved."""

    def reset(self, cursor: Any, ids: Sequence[int]) -> int:
        """FAILED or CANCELLED tasks to PENDING with no attempts spent; how many moved."""

    def purge(self, cursor: Any, *, statuses: Sequence[str], before: datetime, limit: int) -> tuple[int, int]:
        """Delete up to ``limit`` finished tasks last updated before ``before``, with their attempts and
        stored steps; (tasks, attempts)."""

    def held(self, cursor: Any, ids: Sequence[int]) -> list[int]:
        """Of the tasks ``ids``, those whose row another open transaction locks now (an owner
        inside ``fenced()``, a claim its caller has not committed yet), in id order.

        Found without waiting and without keeping a lock once it returns, inside the caller's
        transaction too. A database without row locks (SQLite) answers ``[]``.
        """

    def commit_unconfirmed(self, db: Any) -> bool:
        """Whether a commit on Django connection ``db`` since the last call had its wait for the
        synchronous standby cancelled (PostgreSQL's warning): done on the primary, maybe not on the
        standby. Reads and clears; ``False`` where there is no such wait."""

    # -- epochs (DESIGN §13) -------------------------------------------------------------------
    def read_epoch(self, cursor: Any) -> EpochState:
        """The store's current epoch (no row: no bumps, as the claims count it)."""

    def bump_epoch(self, cursor: Any) -> bool:
        """One more epoch (``taskclaim_epoch --bump``), writing its row if missing; ``False`` at the last."""

    # -- progress (issue 45) -----------------------------------------------------------------
    def set_progress(self, cursor: Any, task_id: int, token: int, fraction: float, note: str) -> bool:
        """Store a claim's progress (with its token) if the claim (id, token) still holds the task:
        whether it did."""

    def report_settings(self, cursor: Any) -> None:
        """Inside a transaction: settings for a report's queries (the admin dashboard's) until it ends;
        PostgreSQL turns JIT compilation off, which costs more than such a query saves."""
