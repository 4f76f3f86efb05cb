"""The relay's decisions, against an HTTP server in this process: a 2xx is delivered, a 5xx, a
409 for a call still in flight and no answer at all are retried with backoff (failed once the attempts are
used up), any other 4xx is final; each answer is recorded with its status and an excerpt."""

from __future__ import annotations

import datetime as dt
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from django_taskclaim import routing
from django_taskclaim.exceptions import InvalidArgument
from django_taskclaim.models import OutboxMessage, Task
from django_taskclaim.relay import Relay, backoff, claim_messages
from django_taskclaim.store import DbNow
from tests.sessions import kill_session_of

pytestmark = pytest.mark.django_db(transaction=True)

ANSWERS = {"/ok": (201, b"created"), "/busy": (409, b"key in progress"), "/stale": (409, b"older token"),
           "/bad": (400, b"missing field"), "/down": (503, b"x" * 5000)}
PROBLEM = "application/problem+json"
IN_FLIGHT, STALE_TOKEN = "urn:taskclaim:problem:in-flight", "urn:taskclaim:problem:stale-token"  # the contract's
# fenced_endpoint's two 409s: a problem type each, and Retry-After for the one to retry.
PROBLEMS = {
    "/in-flight": (409, {"Retry-After": "7"}, {"type": IN_FLIGHT, "title": "A call with this key is running"}),
    "/stale-owner": (409, {}, {"type": STALE_TOKEN, "title": "A newer owner has called"}),
}


class Handler(BaseHTTPRequestHandler):
    requests: list[tuple[str, str, dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Handler.requests.append((self.command, self.path, dict(self.headers), body))
        extra: dict[str, str] = {}
        path = self.path.split("?")[0]
        if path in PROBLEMS:
            code, extra, problem = PROBLEMS[path]
            text = json.dumps(problem).encode()
            extra = {**extra, "Content-Type": PROBLEM}
        else:
            code, text = ANSWERS[path]
        self.send_response(code)
        for name, value in {"Content-Length": str(len(text)), **extra}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(text)

    do_PUT = do_POST

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Handler.requests = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def record(url: str, key: str, method: str = "POST", *, claims: int = 1, headers: dict[str, str] | None = None) -> int:
    """Record one message to ``url`` for task ``key``, by its ``claims``-th owner (each claim before
    gives the task back: the token grows)."""
    for _ in range(claims - 1):
        earlier = Task.objects.claim(key, tenant="t1", lease=30).claim
        assert earlier is not None
        earlier.release()
    claim = Task.objects.claim(key, tenant="t1", lease=30).claim
    assert claim is not None
    with claim.fenced():
        own = {"headers": headers} if headers else {}
        message_id = claim.outbox.http(method, url, json={"key": key}, effect="e", **own)
        claim.complete(None)
    return message_id


def test_answers_decide_delivered_retried_or_failed(server: str) -> None:
    ids = {path: record(server + path, path) for path in ANSWERS}
    closed = record("http://127.0.0.1:9/nothing-listens", "closed")
    relay = Relay(routing.databases(), lease=30, timeout=5, backoff=60, max_attempts=3)
    assert relay.run_once() == len(ANSWERS) + 1
    got = {m.pk: m for m in OutboxMessage.objects.all()}
    assert (got[ids["/ok"]].status, got[ids["/ok"]].answer_status, got[ids["/ok"]].answer_excerpt) == (
        "delivered", 201, "created")
    assert (got[ids["/stale"]].status, got[ids["/stale"]].answer_status) == ("failed", 409)
    assert (got[ids["/bad"]].status, got[ids["/bad"]].answer_excerpt) == ("failed", "missing field")
    for retried in (ids["/busy"], ids["/down"], closed):
        assert got[retried].status == "pending" and got[retried].lease_expires_at is None
    assert got[closed].answer_status is None and "Connection refused" in got[closed].answer_excerpt
    assert len(got[ids["/down"]].answer_excerpt) == 2000  # a bounded excerpt
    # The backoff puts the retries a minute ahead by the database clock: nothing is due now.
    assert OutboxMessage.objects.filter(status="pending", next_try_at__gt=DbNow()).count() == 3
    assert relay.run_once() == 0
    assert relay.counts == {"delivered": 1, "failed": 2, "retried": 3, "lost": 0}


def test_the_request_carries_the_contracts_headers_and_body(server: str) -> None:
    # The third owner records it: the task's token differs from the relay's own first token.
    message_id = record(server + "/ok", "order:9", method="PUT", claims=3)
    Relay(routing.databases(), lease=30, timeout=5).run_once()
    [(method, path, headers, body)] = Handler.requests
    assert (method, path, body) == ("PUT", "/ok", b'{"key": "order:9"}')
    token = Task.objects.get(key="order:9").fencing_token
    relay_token = OutboxMessage.objects.get(pk=message_id).relay_token
    assert token != relay_token, "the test cannot tell the task's token from the relay's"
    assert headers["Taskclaim-Fencing-Token"] == str(token)
    assert headers["Idempotency-Key"].startswith("tc1-")
    assert headers["Idempotency-Key"] != headers["Taskclaim-Fencing-Key"]  # the effect-free key
    assert headers["Content-Type"] == "application/json"


def test_retries_end_in_failure_after_max_attempts(server: str) -> None:
    message_id = record(server + "/down", "flaky")
    relay = Relay(routing.databases(), lease=30, timeout=5, backoff=0.001, max_attempts=2)
    relay.run_once()
    OutboxMessage.objects.filter(pk=message_id).update(next_try_at=None)  # due again now
    relay.run_once()
    message = OutboxMessage.objects.get(pk=message_id)
    assert (message.status, message.attempts, message.answer_status) == ("failed", 2, 503)
    assert len(Handler.requests) == 2


def test_backoff_doubles_up_to_ten_minutes() -> None:
    assert [backoff(n, 1.0) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff(40, 1.0) == 600.0


def test_until_drained_exits_and_reports(server: str) -> None:
    record(server + "/ok", "a")
    record(server + "/bad", "b")
    from io import StringIO
    out = StringIO()
    call_command("taskclaim_relay", "--until-drained", "--json", stdout=out)
    assert out.getvalue().strip() == '{"delivered": 1, "failed": 1, "retried": 0, "lost": 0}'


def test_a_timeout_not_shorter_than_the_lease_is_refused() -> None:
    with pytest.raises(CommandError, match="--timeout") as raised:
        call_command("taskclaim_relay", "--lease", "5", "--timeout", "5")
    assert raised.value.returncode == 2
    with pytest.raises(InvalidArgument, match="shorter than the relay's lease"):
        Relay(routing.databases(), lease=5, timeout=4.5)


def test_a_message_the_lease_cannot_cover_is_released_unsent(server: str) -> None:
    """A delivery that could outlast the relay's lease (the timeout with a second to spare) is not
    started: the message goes back, its attempt uncounted, for a relay with time left."""
    message_id = record(server + "/ok", "late")
    relay = Relay(routing.databases(), lease=10, timeout=8.5)
    relay.lease = 9.0  # the lease shortened under it: its first delivery could outlast it
    assert relay.run_once() == 1
    message = OutboxMessage.objects.get(pk=message_id)
    assert (message.status, message.attempts, message.lease_expires_at) == ("pending", 0, None)
    assert Handler.requests == []


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's one writer")
def test_a_relay_claims_while_another_connection_writes_on_sqlite(server: str) -> None:
    """The relay's claim reads, then writes: on SQLite a transaction that read first cannot take the
    write lock while another connection holds it ("database is locked" at once, without the busy
    timeout). It takes the write lock first, and waits its turn."""
    record(server + "/ok", "waiting")
    in_block, done, updating = threading.Event(), threading.Event(), threading.Event()
    got: list[object] = []

    def writer() -> None:  # an owner recording its message, inside fenced(): the write lock held
        claim = Task.objects.claim("writer", lease=30).claim
        assert claim is not None
        with claim.fenced():
            claim.outbox.http("POST", server + "/ok")
            in_block.set()
            done.wait(30)
            claim.complete(None)
        connection.close()

    def relay() -> None:
        connection.ensure_connection()
        connection.connection.set_trace_callback(lambda sql: updating.set() if sql.startswith("UPDATE") else None)
        try:
            got.append(claim_messages(Task.objects.db, owner="r#1", lease=30, batch=10))
        except Exception as exc:
            got.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer)]
    threads[0].start()
    assert in_block.wait(30)
    threads.append(threading.Thread(target=relay))
    threads[1].start()
    assert updating.wait(30)  # the relay's transaction has sent its first write
    done.set()
    for thread in threads:
        thread.join(30)
    [claimed] = got
    assert isinstance(claimed, list), claimed
    # It waited for the writer's commit, so it found the writer's message too.
    assert sorted(m.task_key for m in claimed) == ["waiting", "writer"]


def test_a_relay_whose_session_is_dropped_goes_on_with_a_new_one(server: str) -> None:
    """A database restart or failover drops the relay's session: the round that meets it is said
    (not raised, so the relay process lives on) and the next round delivers on a new session."""
    if connection.vendor == "sqlite":
        pytest.skip("terminating a session needs a database server (PostgreSQL, MariaDB)")
    record(server + "/ok", "a")
    relay = Relay(routing.databases(), lease=30, timeout=5)
    connection.ensure_connection()
    kill_session_of(connection)
    assert relay.run_once() == 0
    assert relay.run_once() == 1
    assert OutboxMessage.objects.get().status == "delivered"


def raw_message(url: str, key: str, **fields: object) -> int:
    """A message as an older version recorded it, past today's checks at record time."""
    claim = Task.objects.claim(key, tenant="t1", lease=30).claim
    assert claim is not None
    with claim.fenced():
        message_id = claim.outbox.http("POST", "http://127.0.0.1:9/x", effect="e")
        claim.complete(None)
    OutboxMessage.objects.filter(pk=message_id).update(url=url, **fields)
    return message_id


def test_a_message_that_cannot_be_sent_fails_and_the_others_go_on(
        server: str, caplog: pytest.LogCaptureFixture) -> None:
    """A non-ASCII URL (recorded before the outbox refused it) cannot be put on the wire: the relay
    records it failed, once, and delivers the messages behind it in the same round."""
    bad = raw_message(server + "/caf\u00e9", "unsendable")
    good = record(server + "/ok", "healthy")
    relay = Relay(routing.databases(), lease=30, timeout=5, max_attempts=2)
    with caplog.at_level(logging.INFO, logger="django_taskclaim"):
        assert relay.run_once() == 2
    failed, delivered = OutboxMessage.objects.get(pk=bad), OutboxMessage.objects.get(pk=good)
    assert (failed.status, failed.attempts, failed.answer_status) == ("failed", 1, None)
    assert "not sendable" in failed.answer_excerpt and "UnicodeEncodeError" in failed.answer_excerpt
    assert delivered.status == "delivered"
    assert relay.counts == {"delivered": 1, "failed": 1, "retried": 0, "lost": 0}
    # A message that ended failed is said at WARNING, the others at INFO.
    levels = {r.getMessage().split(" (")[0]: r.levelname for r in caplog.records if r.getMessage().startswith("relay:")}
    assert levels == {f"relay: message {bad} failed": "WARNING", f"relay: message {good} delivered": "INFO"}


def test_a_message_claimed_more_than_its_attempts_fails_without_being_sent(server: str) -> None:
    """Relays that died (or lost their lease) on a message left it claimed ``max_attempts`` times and
    never answered: the next relay records it failed instead of sending it once more."""
    message_id = raw_message(server + "/ok", "killer", attempts=2)
    relay = Relay(routing.databases(), lease=30, timeout=5, max_attempts=2)
    assert relay.run_once() == 1
    message = OutboxMessage.objects.get(pk=message_id)
    assert (message.status, message.attempts) == ("failed", 3)
    assert "2 deliveries started and none recorded an answer" in message.answer_excerpt
    assert Handler.requests == []


def test_the_two_409s_are_told_apart_by_their_problem_type(server: str) -> None:
    """A stale owner's 409 is final; a 409 for the same key still in flight is retried, after its
    Retry-After when that is longer than the backoff."""
    in_flight = record(server + "/in-flight", "in-flight")
    stale = record(server + "/stale-owner", "stale-owner")
    relay = Relay(routing.databases(), lease=30, timeout=5, backoff=0.001, max_attempts=5)
    relay.run_once()
    retried, failed = OutboxMessage.objects.get(pk=in_flight), OutboxMessage.objects.get(pk=stale)
    assert (failed.status, failed.answer_status) == ("failed", 409)
    assert (retried.status, retried.answer_status) == ("pending", 409)
    # Not before the Retry-After of 7 s (the backoff alone was a millisecond), by the database clock.
    assert OutboxMessage.objects.filter(pk=in_flight, next_try_at__gt=DbNow() + dt.timedelta(seconds=5)).exists()


class Dribbler:
    """A downstream that answers one byte every ``pause`` seconds, for ``length`` bytes: each read
    of the relay's gets a byte within its socket timeout, so only an overall deadline ends it."""

    def __init__(self, pause: float, length: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.pause, self.length = pause, length
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/slow"

    def serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + b"X-Pad: " + b"p" * self.length + b"\r\n\r\nok"
        with conn:
            for byte in answer:
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return  # the relay hung up
                time.sleep(self.pause)  # the downstream's own pace, not a synchronisation

    def close(self) -> None:
        self.listener.close()


def test_a_delivery_ends_by_its_deadline_however_slowly_the_answer_comes() -> None:
    """``--timeout`` bounds the whole request: a downstream answering a byte every 0.2 s (each read
    well within a socket timeout) is cut off after the timeout, before the relay's lease runs out."""
    dribbler = Dribbler(pause=0.2, length=100)  # about 25 s to answer in full
    try:
        message_id = record(dribbler.url, "dribbled")
        relay = Relay(routing.databases(), lease=4, timeout=1.5, backoff=60)
        started = time.monotonic()
        relay.run_once()
        elapsed = time.monotonic() - started
    finally:
        dribbler.close()
    message = OutboxMessage.objects.get(pk=message_id)
    assert (message.status, message.answer_status) == ("pending", None), message.answer_excerpt
    assert "no whole answer within the relay's --timeout of 1.5 s" in message.answer_excerpt
    assert elapsed < relay.lease, f"the delivery took {elapsed:.1f} s, past the relay's lease of {relay.lease:g} s"


def test_a_messages_own_headers_are_sent_never_logged_and_dropped_once_delivered(
        server: str, caplog: pytest.LogCaptureFixture) -> None:
    message_id = record(server + "/ok?api_key=s3cr3t-query", "authed", headers={"Authorization": "Bearer s3cr3t-token"})
    with caplog.at_level(logging.DEBUG, logger="django_taskclaim"):
        Relay(routing.databases(), lease=30, timeout=5).run_once()
    [(_, _, headers, _)] = Handler.requests
    assert headers["Authorization"] == "Bearer s3cr3t-token"
    assert "Idempotency-Key" in headers
    logged = "\n".join(r.getMessage() + repr(r.__dict__) for r in caplog.records)
    assert "relay: message" in logged and "s3cr3t" not in logged
    message = OutboxMessage.objects.get(pk=message_id)
    assert (message.status, message.headers) == ("delivered", {})


def test_a_message_is_signed_when_the_relay_sends_it(server: str, settings) -> None:  # type: ignore[no-untyped-def]
    """A message recorded in ``fenced()`` is delivered later: the relay signs it with its own
    ``TASKCLAIM_SIGNING_KEY``, over the recorded task's fencing key and token."""
    from django_taskclaim.idempotency import idempotency_key, signature

    record(server + "/ok", "signed", claims=2)
    settings.TASKCLAIM_SIGNING_KEY = "relay-secret"
    Relay(routing.databases(), lease=30, timeout=5).run_once()
    [(_, _, headers, _)] = Handler.requests
    token = Task.objects.get(key="signed").fencing_token
    assert headers["Taskclaim-Signature"] == signature(
        b"relay-secret", idempotency_key("t1", "signed"), str(token), idempotency_key("t1", "signed", "e"))
