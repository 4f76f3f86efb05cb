"""The rows the store hands out: named tuples whose fields are the columns they come from.

``TaskRow``'s fields are the task table's columns in the order every statement selects them
(``TASK_COLUMNS``), so a row reads by name (``row.fencing_token``) and turns into a model
with ``Task.from_db``. Values arrive decoded: JSON parsed, datetimes timezone-aware.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from ..status import Status

TASK = "django_taskclaim_task"
ATTEMPT = "django_taskclaim_attempt"
#: Coalescing groups (``@coalesced`` Django tasks): each with the id of its latest task.
GROUP = "django_taskclaim_coalescegroup"
GATE = "django_taskclaim_concurrencygate"


class TaskRow(NamedTuple):
    id: int
    tenant: str
    key: str
    status: str
    owner: str
    fencing_token: int
    attempts: int
    max_attempts: int
    lease_expires_at: datetime | None
    payload: Any
    payload_fingerprint: str
    result: Any
    result_ref: str
    error: str
    dispatch: Any
    created_at: datetime
    updated_at: datetime
    queue: str | None
    priority: int
    run_after: datetime | None
    task_path: str


TASK_COLUMNS: tuple[str, ...] = TaskRow._fields


class NewTask(NamedTuple):
    """A queued task to insert (``Store.ensure_many``): ``ensure()``'s values, in the order of its
    parameters, the payload and dispatch already encoded as JSON."""

    tenant: str
    key: str
    max_attempts: int
    payload: str | None
    payload_fingerprint: str
    dispatch: str | None
    queue: str | None
    priority: int
    run_after: datetime | None
    task_path: str
#: The columns of a new attempt row, in the order every insert of one gives them: the last
#: three (a failure's error) start empty, and only a failure fills them in.
ATTEMPT_COLUMNS = ("task_id, token, owner, delivery_id, started_at, ended_at, outcome, stale_writes, "
                   "error, error_class, traceback")
NO_ERROR = "'', '', ''"
JSON_COLUMNS = frozenset({"payload", "result", "dispatch"})
DATETIME_COLUMNS = frozenset({"lease_expires_at", "created_at", "updated_at", "run_after"})


class Claimed(NamedTuple):
    """A task this call claimed, and the owner it was taken over from (``None``: it was free).

    ``reserved``: claimed for later and not started (a batch's tasks after its first): its attempt
    is not counted and no attempt row is open until it starts (``Store.start``), and its lease is
    a short reservation, so that a worker that dies before starting it releases it soon, its
    attempt count unchanged."""

    row: TaskRow
    previous_owner: str | None
    reserved: bool = False


@dataclass
class Start:
    """The start of a reserved claim, carried by the statement that ends the task before it
    (``Store.finish(..., start=...)``): the worker's next task starts in its predecessor's commit,
    with no round trip of its own. The store sets ``expires`` (the started lease's expiry) when the
    ending matched and the start did; ``None`` when the reserved claim was taken over meanwhile."""

    task_id: int
    token: int
    owner: str
    lease: float
    delivery_id: str
    #: Whether the ending matched, so that the start was tried (and ``expires`` says how it went).
    tried: bool = False
    expires: datetime | None = None


def in_claim_order(claimed: list[Claimed]) -> list[Claimed]:
    """The claims of one queue claim in the order to run them: the started one first (a reserving
    claim starts one), then the highest priority, then the oldest."""
    return sorted(claimed, key=lambda c: (c.reserved, -c.row.priority, c.row.id))


def first_to_run(rows: list[TaskRow]) -> TaskRow | None:
    """Of the rows one queue claim took, the one a reserving claim starts: the highest priority,
    then the oldest (the order of :func:`in_claim_order`)."""
    return min(rows, key=lambda r: (-r.priority, r.id), default=None)


class Found(NamedTuple):
    """A task as a claim found it: its row, whether its lease has expired by the database clock,
    and whether this delivery is a duplicate (held under a live lease, or done, with a payload
    that fits), recorded as one in the audit trail where the store could without waiting."""

    row: TaskRow
    expired: bool
    duplicate: bool

    def claimable(self, fingerprint: str) -> bool:
        """Whether a claim whose payload has ``fingerprint`` may take the task as found: not queued
        (work for the queue workers), pending, or running under an expired lease with attempts
        left, and a payload that fits."""
        row = self.row
        free = row.queue is None and row.status == Status.PENDING or (
            row.status == Status.RUNNING and self.expired and row.attempts < row.max_attempts)
        return free and (not fingerprint or row.payload_fingerprint in ("", fingerprint))


class Moved(NamedTuple):
    """A task an operator or the sweeper moved, with the token it held and its new status."""

    id: int
    key: str
    tenant: str
    token: int
    status: str


class StepRow(NamedTuple):
    """A durable step stored under its task: its name, its result as the JSON text stored, and the
    fencing token of the claim that stored it."""

    name: str
    result: str
    token: int
