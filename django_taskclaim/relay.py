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

import contextlib
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
from .idempotency import IN_FLIGHT, STALE_TOKEN, fencing_headers
from .lifecycle.outbox import shown_url
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
    headers: dict[str, str]
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
    if delivered:
        values["headers"] = {}  # its own headers may hold a secret: kept no longer than needed
    return bool(_held(using, message).update(**values))


def release_message(using: str, message: Leased) -> bool:
    """Release a claimed message undelivered (its attempt uncounted): the relay had no time left."""
    return bool(_held(using, message).update(lease_expires_at=None, attempts=F("attempts") - 1))


def _held(using: str, message: Leased) -> Any:
    return OutboxMessage.objects.using(using).filter(
        pk=message.id, status=MessageStatus.PENDING, relay_token=message.relay_token)


@dataclass(frozen=True)
class Answer:
    """What came back from one delivery: the status code (``None``: no answer), a body excerpt, the
    answer's problem type and ``Retry-After`` (seconds) if it had them; ``unsendable`` when the
    message could not be sent at all (sending it again cannot help)."""

    status_code: int | None
    excerpt: str
    problem: str = ""
    retry_after: float | None = None
    unsendable: bool = False

    def retryable(self) -> bool:
        """No answer, a 5xx, or a 409 for a call of the same key still in flight downstream (problem
        type ``in-flight``, or a ``Retry-After``; the body "in progress" of downstreams before them).
        A 409 for an older token (``stale-token``) is final: a newer owner has called."""
        code = self.status_code
        if self.unsendable:
            return False
        if code is None or code >= 500:
            return True
        if code != 409 or self.problem == STALE_TOKEN:
            return False
        return self.problem == IN_FLIGHT or self.retry_after is not None or "in progress" in self.excerpt.lower()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect would turn a POST into a GET without its body: answer it as it came.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Deadline:
    """One delivery's overall deadline. A socket timeout bounds each read, not the request: a
    downstream answering a byte a second would hold it open for ever. Past the deadline the
    delivery's sockets are shut down, which ends a read in progress at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def remaining(self) -> float:
        """Seconds left (a little at least, so that a socket given it times out rather than blocks)."""
        return max(0.001, self.at - time.monotonic())

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    # The plain socket's shutdown, also under TLS: SSLSocket.shutdown would drop its TLS state
    # under the thread reading it.
    with contextlib.suppress(OSError):  # already closed
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _connection(base: type[http.client.HTTPConnection], deadline: _Deadline) -> type[http.client.HTTPConnection]:
    class Connection(base):  # type: ignore[valid-type,misc]
        def connect(self) -> None:
            self.timeout = deadline.remaining()  # connecting too ends by the deadline
            super().connect()
            deadline.watch(self.sock)

    return Connection


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_connection(http.client.HTTPConnection, self.deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_connection(http.client.HTTPSConnection, self.deadline), req)


def deliver(message: Leased, *, timeout: float) -> Answer:
    """Send ``message`` once with its headers and the contract's, all of it (connecting, sending,
    reading the answer) within ``timeout`` seconds; its answer (never raises for HTTP)."""
    headers = dict(message.headers or {})
    headers.update(fencing_headers(message.tenant, message.task_key, message.token, message.effect))
    data = None
    if message.body is not None:
        data = json.dumps(message.body, ensure_ascii=False).encode()
        headers["Content-Type"] = "application/json"
    deadline = _Deadline(timeout)
    opener = urllib.request.build_opener(_NoRedirect, _HTTPHandler(deadline), _HTTPSHandler(deadline))
    try:
        # http(s) only: claim.outbox.http() validated the URL (validate_url) when it was recorded.
        request = urllib.request.Request(message.url, data=data, headers=headers, method=message.method)  # noqa: S310
        with deadline:
            try:
                with opener.open(request, timeout=timeout) as response:
                    return _answer(response.status, response)
            except urllib.error.HTTPError as exc:
                with exc:
                    return _answer(exc.code, exc)
    except (ValueError, OSError, http.client.HTTPException) as exc:
        if deadline.expired:  # its sockets were shut down under it
            return Answer(None, f"TimeoutError: no whole answer within the relay's --timeout of {timeout:g} s "
                                f"({type(exc).__name__})")
        if isinstance(exc, ValueError | http.client.InvalidURL):
            # What http.client cannot put on the wire (a URL or a header it cannot encode, recorded
            # before the outbox refused them): sending it again cannot help.
            return Answer(None, f"not sendable: {type(exc).__name__}: {exc}"[:EXCERPT_LENGTH], unsendable=True)
        return Answer(None, f"{type(exc).__name__}: {exc}"[:EXCERPT_LENGTH])  # refused, reset, a broken answer


def _answer(status: int, response: Any) -> Answer:
    excerpt = _excerpt(response)
    problem = ""
    if "problem+json" in (response.headers.get("Content-Type") or ""):
        try:
            found = json.loads(excerpt)
        except ValueError:
            found = None
        if isinstance(found, dict) and isinstance(found.get("type"), str):
            problem = found["type"]
    retry_after = None
    value = (response.headers.get("Retry-After") or "").strip()
    if value.isdigit():  # seconds; an HTTP date is read as "soon"
        retry_after = min(float(value), MAX_BACKOFF)
    elif value:
        retry_after = 0.0
    return Answer(status, excerpt, problem, retry_after)


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
        if message.attempts > self.max_attempts:
            # Claimed that often without an answer recorded: it killed its relays, or they lost their
            # lease each time. Whatever it does to a relay, it ends failed and the others go on.
            answer = Answer(None, f"not sent again: {message.attempts - 1} deliveries started and none "
                                  "recorded an answer (each relay died or lost its lease)", unsendable=True)
        else:
            try:
                answer = deliver(message, timeout=self.timeout)
            except Exception as exc:  # a bug or a message nobody foresaw: recorded, retried, then failed
                logger.warning("relay: message %s raised %s while being sent", message.id, type(exc).__name__,
                               exc_info=True, extra={"key": message.task_key, "tenant": message.tenant})
                answer = Answer(None, f"{type(exc).__name__}: {exc}"[:EXCERPT_LENGTH])
        code = answer.status_code
        delivered = code is not None and 200 <= code < 300
        retry = not delivered and answer.retryable()
        final = not delivered and (not retry or message.attempts >= self.max_attempts)
        wait = backoff(message.attempts, self.backoff)
        if answer.retry_after is not None:
            wait = min(MAX_BACKOFF, max(wait, answer.retry_after))
        kept = record_answer(alias, message, delivered=delivered, final=final, status_code=code,
                             excerpt=answer.excerpt, backoff=wait)
        outcome = "lost" if not kept else "delivered" if delivered else "failed" if final else "retried"
        self.counts[outcome] += 1
        # Never the message's headers, nor its URL's password or query string: they may hold secrets.
        logger.log(logging.WARNING if outcome == "failed" else logging.INFO,
                   "relay: message %s %s (%s %s, answer %s, attempt %s)", message.id, outcome, message.method,
                   shown_url(message.url), code, message.attempts,
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
