"""Both sides of a fenced call, as OS processes (tests/integrations/downstream/test_downstream_processes.py).

``python -m tests.programs.downstream serve [HOLD]``: the test project served over HTTP on a free
port of 127.0.0.1 (wsgiref, a thread per request); says ``ready`` with its port; its view
``downstream/held/`` holds the answers to its first HOLD calls after their effect committed
(``held``) until the line ``release``.

``... call PATH HEADERS_JSON``: says ``ready``, waits for ``go``, says ``sending`` and POSTs
``{"amount": 10}`` to PATH through Django's test client in this process (its own database
session); says ``done`` with the status, the body and whether it was replayed. The view holds
inside its transaction when HEADERS_JSON has ``X-Test-Hold``, until a line comes on stdin.

``... worker KEY URL LEASE``: claims KEY, says ``claimed`` and, inside ``keepalive()``, stops
itself (SIGSTOP) until the test continues it past its lease; then waits for a line and POSTs
to URL with the claim's headers for effect ``charge``, and says ``answered`` with the status: a
worker that does not know it was replaced.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.error
import urllib.request
from typing import Any

from devtools.events import emit

BODY = json.dumps({"amount": 10}).encode()


def post(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """POST ``BODY`` to ``url``: the status and body, an error status included."""
    request = urllib.request.Request(  # noqa: S310 (a test's own http URL)
        url, BODY, {**headers, "Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (a test's own URL)
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def serve(hold: int = 0) -> None:
    """Serve the test project; with ``hold``, ``downstream/held/`` holds the answers to its first
    ``hold`` calls after their effect (event ``held``) until the line ``release`` comes on stdin."""
    import threading
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from django.core.wsgi import get_wsgi_application

    from tests.testapp import downstream_views

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
            pass

    class Threading(ThreadingMixIn, WSGIServer):  # a held call does not hold up the next
        daemon_threads = True

    downstream_views.HOLD["left"] = hold
    if hold:
        def released() -> None:
            while sys.stdin.readline().strip() != "release":
                pass
            downstream_views.RELEASED.set()

        threading.Thread(target=released, daemon=True).start()
    server = make_server("127.0.0.1", 0, get_wsgi_application(), server_class=Threading, handler_class=Quiet)
    emit(event="ready", port=server.server_port)
    server.serve_forever()


def call(path: str, headers: dict[str, str]) -> None:
    from django.db import connection
    from django.test import Client

    connection.ensure_connection()
    emit(event="ready")
    sys.stdin.readline()
    emit(event="sending")
    response = Client().post(path, BODY, content_type="application/json", headers=headers)
    emit(event="done", status=response.status_code, body=response.content.decode(),
         replayed=response.get("Idempotent-Replayed", ""))


def worker(key: str, url: str, lease: float) -> None:
    from django_taskclaim.exceptions import StaleClaim
    from django_taskclaim.models import Task

    claim = Task.objects.claim(key, owner=f"worker-{os.getpid()}", lease=lease).claim
    assert claim is not None, f"{key} was not claimable"
    try:
        # The first heartbeat comes one interval after the block starts: the worker stops itself
        # before it, so no heartbeat's transaction is left holding a lock while it is stopped.
        with claim.keepalive(interval=lease / 2):
            emit(event="claimed", token=claim.token)
            os.kill(os.getpid(), signal.SIGSTOP)  # paused past its lease, until the test's SIGCONT
            sys.stdin.readline()
            status, body = post(url, claim.headers("charge"))
            emit(event="answered", status=status, body=body.decode())
    except StaleClaim:
        emit(event="stale", token=claim.token)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    command, *args = sys.argv[1:]
    if command == "serve":
        serve(int(args[0]) if args else 0)
    elif command == "call":
        call(args[0], json.loads(args[1]))
    elif command == "worker":
        worker(args[0], args[1], float(args[2]))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
