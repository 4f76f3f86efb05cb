"""The relay's decisions, against an HTTP server in this process: a 2xx is delivered, a 5xx, a
409 "in progress" and no answer at all are retried with backoff (failed once the attempts are
used up), any other 4xx is final; each answer is recorded with its status and an excerpt."""

from __future__ import annotations

import threading
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


class Handler(BaseHTTPRequestHandler):
    requests: list[tuple[str, str, dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Handler.requests.append((self.command, self.path, dict(self.headers), body))
        code, text = ANSWERS[self.path]
        self.send_response(code)
        self.send_header("Content-Length", str(len(text)))
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


def record(url: str, key: str, method: str = "POST") -> int:
    claim = Task.objects.claim(key, tenant="t1", lease=30).claim
    assert claim is not None
    with claim.fenced():
        message_id = claim.outbox.http(method, url, json={"key": key}, effect="e")
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
    record(server + "/ok", "order:9", method="PUT")
    Relay(routing.databases(), lease=30, timeout=5).run_once()
    [(method, path, headers, body)] = Handler.requests
    assert (method, path, body) == ("PUT", "/ok", b'{"key": "order:9"}')
    token = Task.objects.get(key="order:9").fencing_token
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
