"""The relay: delivers the outbox's messages (``manage.py taskclaim_relay``).

A message is claimed as a task is: one conditional ``UPDATE`` gives it a lease and a new relay
token (``SELECT … FOR UPDATE SKIP LOCKED`` first on PostgreSQL and MySQL/MariaDB, so relays pass
each other by; SQLite's write lock serialises them). The answer is recorded only while that
token still holds the message: a relay that outlived its lease cannot overwrite its successor's
record. A relay killed mid-delivery leaves the message to the next relay once the lease runs out,
which sends it again with the same ``Idempotency-Key``: delivered at least once, taking effect
once where the downstream recognises the key.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django.db import close_old_connections, connections, transaction
from django.db.models import F, Q

from . import outages, routing
from .exceptions import InvalidArgument
from .idempotency import fencing_headers
from .models import OutboxMessage
from .status import MessageStatus
from .store import DbNow, DbNowPlus, get_store

logger = logging.getLogger("django_taskclaim")

#: Characters of an answer's body kept with the message.
EXCERPT_LENGTH = 2000
MAX_BACKOFF = 600.0

_CLAIMABLE = (Q(status=MessageStatus.PENDING)
              & (Q(next_try_at__isnull=True) | Q(next_try_at__lte=DbNow()))
              & (Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=DbNow())))


class Leased(NamedTuple):
    """A message a relay holds: what to send, and the relay's token that fences its record."""

    id: int
    tenant: str
    task_key: str
    token: int
    effect: str
    method: str
    url: str
    body: Any
    attempts: int
    relay_owner: str
    relay_token: int


_COLUMNS = Leased._fields


def claim_messages(using: str, *, owner: str, lease: float, batch: int) -> list[Leased]:
    """Claim up to ``batch`` due messages of database ``using`` for ``owner`` (unique per call:
    the rows read back are those this call's ``UPDATE`` moved), each for ``lease`` seconds."""
    messages = OutboxMessage.objects.using(using)
    with transaction.atomic(using=using):
        with connections[using].cursor() as cursor:
            # SQLite: the write lock first, as every transaction of the store's that reads before it
            # writes (a read's lock cannot become the write lock while another connection writes).
            get_store(using).begin_write(cursor)
        # SKIP LOCKED: another relay's rows under claim are passed by (ignored where the database
        # has no row locks: SQLite's one writer serialises the claims).
        ids = list(messages.filter(_CLAIMABLE).order_by("id").select_for_update(skip_locked=True)
                   .values_list("pk", flat=True)[:batch])
        if not ids:
            return []
        # The claim's predicate is in the UPDATE's own WHERE: a row changed since it was read
        # (claimed by another relay on SQLite) is not taken twice.
        moved = messages.filter(_CLAIMABLE, pk__in=ids).update(
            relay_owner=owner, relay_token=F("relay_token") + 1, lease_expires_at=DbNowPlus(lease),
            attempts=F("attempts") + 1)
        if not moved:
            return []
        rows = messages.filter(pk__in=ids, relay_owner=owner, status=MessageStatus.PENDING).order_by("id")
        return [Leased(*row) for row in rows.values_list(*_COLUMNS)]


def record_answer(using: str, message: Leased, *, delivered: bool, final: bool, status_code: int | None,
                  excerpt: str, backoff: float = 0.0) -> bool:
    """Record the answer to ``message``'s delivery while the relay's claim still holds it: delivered,
    failed (``final``), or pending again after ``backoff`` seconds. False when the claim was lost."""
    if delivered:
        status = MessageStatus.DELIVERED
    elif final:
        status = MessageStatus.FAILED
    else:
        status = MessageStatus.PENDING
    values: dict[str, Any] = {
        "status": status, "lease_expires_at": None, "answer_status": status_code,
        "answer_excerpt": excerpt[:EXCERPT_LENGTH],
    }
    if status == MessageStatus.PENDING:
        values["next_try_at"] = DbNowPlus(backoff)
    else:
        values["delivered_at"] = DbNow()
    return bool(_held(using, message).update(**values))


def release_message(using: str, message: Leased) -> bool:
    """Release a claimed message undelivered (its attempt uncounted): the relay had no time left."""
    return bool(_held(using, message).update(lease_expires_at=None, attempts=F("attempts") - 1))


def _held(using: str, message: Leased) -> Any:
    return OutboxMessage.objects.using(using).filter(
        pk=message.id, status=MessageStatus.PENDING, relay_token=message.relay_token)


@dataclass(frozen=True)
class Answer:
    """What came back from one delivery: the status code (``None``: no answer) and a body excerpt."""

    status_code: int | None
    excerpt: str

    def retryable(self) -> bool:
        """No answer, a 5xx, or a 409 "in progress" (the downstream still runs the same key)."""
        code = self.status_code
        return (code is None or code >= 500
                or (code == 409 and "in progress" in self.excerpt.lower()))


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect would turn a POST into a GET without its body: answer it as it came.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def deliver(message: Leased, *, timeout: float) -> Answer:
    """Send ``message`` once with the contract's headers; its answer (never raises for HTTP)."""
    headers = fencing_headers(message.tenant, message.task_key, message.token, message.effect)
    data = None
    if message.body is not None:
        data = json.dumps(message.body, ensure_ascii=False).encode()
        headers["Content-Type"] = "application/json"
    # http(s) only: claim.outbox.http() validated the URL (validate_url) when it was recorded.
    request = urllib.request.Request(message.url, data=data, headers=headers, method=message.method)  # noqa: S310
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return Answer(response.status, _excerpt(response))
    except urllib.error.HTTPError as exc:
        with exc:
            return Answer(exc.code, _excerpt(exc))
    except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, a broken answer
        return Answer(None, f"{type(exc).__name__}: {exc}"[:EXCERPT_LENGTH])


def _excerpt(response: Any) -> str:
    try:
        data = response.read(EXCERPT_LENGTH * 4)
    except (OSError, http.client.HTTPException) as exc:
        return f"(the answer's body could not be read: {exc})"
    return data.decode("utf-8", "replace").replace("\x00", "")[:EXCERPT_LENGTH]


def backoff(attempts: int, base: float) -> float:
    """Seconds before a retry after ``attempts`` deliveries: ``base`` doubled each time, at most 10 min."""
    return min(MAX_BACKOFF, base * 2 ** max(0, attempts - 1))


@dataclass
class Relay:
    """One relay process: claims due messages of its databases and delivers them in turn."""

    databases: Iterable[str]
    lease: float = 60.0
    batch: int = 10
    timeout: float = 10.0
    max_attempts: int = 10
    backoff: float = 1.0
    idle: float = 0.5
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        if self.timeout + 1.0 >= self.lease:
            # Every delivery must end within the lease, or another relay may send the message too.
            raise InvalidArgument(
                f"the HTTP timeout ({self.timeout:g} s) must be shorter than the relay's lease ({self.lease:g} s) "
                "by more than a second: a delivery must end before another relay may send the message again")
        self.databases = tuple(self.databases)
        self.owner = f"relay:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.counts = {"delivered": 0, "failed": 0, "retried": 0, "lost": 0}
        self._round = 0

    def run_once(self) -> int:
        """One round over every database: the messages claimed (0 when none was due)."""
        claimed = 0
        for alias in self.databases:
            try:
                claimed += self._round_of(alias)
                outages.up(alias)
            except routing.UNREACHABLE as exc:
                # A database restarting, failing over or dropping the session: said once, its
                # session opened afresh next round. A message delivered whose answer could not be
                # recorded is delivered again after its lease, with the same idempotency key.
                outages.down(alias, exc)
                connections[alias].close()
        return claimed

    def _round_of(self, alias: str) -> int:
        self._round += 1
        started = time.monotonic()
        messages = claim_messages(alias, owner=f"{self.owner}#{self._round}", lease=self.lease, batch=self.batch)
        for message in messages:
            # A delivery that could outlast the lease would overlap the next relay's: give it back.
            if time.monotonic() - started + self.timeout + 1.0 > self.lease or self.stop.is_set():
                release_message(alias, message)
                continue
            self._deliver(alias, message)
        return len(messages)

    def _deliver(self, alias: str, message: Leased) -> None:
        answer = deliver(message, timeout=self.timeout)
        code = answer.status_code
        delivered = code is not None and 200 <= code < 300
        retry = not delivered and answer.retryable()
        final = not delivered and (not retry or message.attempts >= self.max_attempts)
        kept = record_answer(alias, message, delivered=delivered, final=final, status_code=code,
                             excerpt=answer.excerpt, backoff=backoff(message.attempts, self.backoff))
        outcome = "lost" if not kept else "delivered" if delivered else "failed" if final else "retried"
        self.counts[outcome] += 1
        logger.info("relay: message %s %s (%s %s, answer %s, attempt %s)", message.id, outcome, message.method,
                    message.url, code, message.attempts,
                    extra={"key": message.task_key, "tenant": message.tenant, "token": message.token,
                           "owner": message.relay_owner})

    def pending(self) -> int:
        """Messages still to deliver in the relay's databases (due or not, leased or not); a
        database out of reach counts as holding some (its messages are not known to be done)."""
        left = 0
        for alias in self.databases:
            try:
                left += OutboxMessage.objects.using(alias).filter(status=MessageStatus.PENDING).count()
            except routing.UNREACHABLE as exc:
                outages.down(alias, exc)
                connections[alias].close()
                left += 1
        return left

    def run(self, *, until_drained: bool = False) -> None:
        """Deliver until stopped (or, with ``until_drained``, until no message is pending)."""
        while not self.stop.is_set():
            close_old_connections()
            if self.run_once():
                continue
            if until_drained and not self.pending():
                return
            self.stop.wait(self.idle)


__all__ = ["Answer", "Leased", "Relay", "backoff", "claim_messages", "deliver", "release_message", "record_answer"]
