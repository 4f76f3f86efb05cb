"""The outbox with tenants routed over two task databases: a message lives in its task's
database (recorded in the fenced block's transaction there), and a relay over every task
database delivers each one from where it lives."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from django_taskclaim import routing
from django_taskclaim.models import OutboxMessage, Task
from django_taskclaim.relay import Relay
from tests.sharding import ON_A, ON_B, SHARDED_TESTS, A, B

pytestmark = SHARDED_TESTS


class Handler(BaseHTTPRequestHandler):
    keys: list[str] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Handler.keys.append(self.headers["Idempotency-Key"])
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Handler.keys = []
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/hook"
    httpd.shutdown()
    httpd.server_close()


def test_each_message_lives_in_its_tasks_database_and_is_delivered_from_there(url: str) -> None:
    for tenant in (ON_A[0], ON_B[0]):
        claim = Task.objects.claim("publish", tenant=tenant, lease=30).claim
        assert claim is not None
        with claim.fenced():
            claim.outbox.http("POST", url, json={"tenant": tenant})
            claim.complete(None)
    assert list(OutboxMessage.objects.using(A).values_list("tenant", flat=True)) == [ON_A[0]]
    assert list(OutboxMessage.objects.using(B).values_list("tenant", flat=True)) == [ON_B[0]]
    relay = Relay(routing.databases(), lease=30, timeout=5)
    assert relay.run_once() == 2
    assert len(Handler.keys) == 2
    for alias in (A, B):
        assert list(OutboxMessage.objects.using(alias).values_list("status", "answer_status")) == [("delivered", 204)]
