"""A tiny downstream service for the outbox's tests: ``python -m tests.programs.effect_counter [HOLD]``.

A stdlib HTTP server on 127.0.0.1 (a free port, said in its ``ready`` event) that takes effect
once per ``Idempotency-Key``: the first request of a key is its effect, a repeat gets the first
answer again and is counted. The first request of each of the first ``HOLD`` keys takes effect
and then holds its answer (event ``held``) until the line ``release`` arrives — so a test can
kill the relay that sent it mid-delivery, after the effect and before the answer. The line
``report`` answers with event ``report``: ``effects`` (key → times it took effect) and ``seen``
(key → requests with that key). It needs no Django and no database.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from devtools.events import emit

lock = threading.Lock()
effects: Counter[str] = Counter()
seen: Counter[str] = Counter()
held_keys: list[str] = []
release = threading.Event()
HOLD = int(sys.argv[1]) if len(sys.argv) > 1 else 0


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        key = self.headers.get("Idempotency-Key")
        if not key or not self.headers.get("Taskclaim-Fencing-Token"):
            self._answer(400, b"missing Idempotency-Key or Taskclaim-Fencing-Token")
            return
        with lock:
            seen[key] += 1
            first = seen[key] == 1
            if first:
                effects[key] += 1  # the effect, once per key
            hold = first and len(held_keys) < HOLD
            if hold:
                held_keys.append(key)
        if hold:
            emit(event="held", key=key)
            release.wait()
        self._answer(200, b'{"ok": true}')

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    emit(event="ready", port=server.server_address[1])
    for line in sys.stdin:
        command = line.strip()
        if command == "release":
            release.set()
        elif command == "report":
            with lock:
                emit(event="report", effects=dict(effects), seen=dict(seen))
    server.shutdown()


if __name__ == "__main__":
    main()
