"""The outbox phase (issue 34, item 6): what one more row in the completion's commit costs, and
how fast relays deliver.

1. A queue drain of ``Sizes.outbox_tasks`` no-op tasks by ``Sizes.outbox_workers`` processes, each
   task completed inside ``claim.fenced()``: without a message, then with one
   ``claim.outbox.http()`` message per task (the same transaction). The cost per task is the
   difference of the seconds per task.
2. The messages of the second drain delivered by ``Sizes.outbox_workers`` relays
   (``django_taskclaim.relay.Relay``, the loop of ``manage.py taskclaim_relay``) to a no-op HTTP
   endpoint on 127.0.0.1 in this process; the endpoint counts each Idempotency-Key, so a message
   sent twice shows.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .workers import BARRIER_TIMEOUT, LEASE, run_workers

OUTBOX = "django_taskclaim_outboxmessage"


def drain_fenced(index: int, barrier: Any, url: str | None) -> dict[str, Any]:
    """The one-task loop, each completion inside ``fenced()``; with ``url``, one message a task."""
    from django.db import connection

    from django_taskclaim.models import Task

    owner = f"bench-outbox-{index}"
    connection.ensure_connection()
    barrier.wait(BARRIER_TIMEOUT)
    start = time.perf_counter()
    executed: list[int] = []
    while True:
        claims = Task.objects.claim_next(owner=owner, lease=LEASE)
        if not claims:
            break
        claim = claims[0]
        with claim.fenced():
            if url is not None:
                claim.outbox.http("POST", url, json={"task": claim.task_id})
            claim.complete()
        executed.append(claim.task_id)
    return {"executed": executed, "start": start, "end": time.perf_counter()}


def relay(index: int, barrier: Any, batch: int) -> dict[str, Any]:
    """A relay as ``manage.py taskclaim_relay --until-drained`` runs one."""
    from django.db import connection

    from django_taskclaim import routing
    from django_taskclaim.relay import Relay

    connection.ensure_connection()
    relay = Relay(routing.databases(), lease=30, timeout=5, batch=batch, idle=0.01)
    barrier.wait(BARRIER_TIMEOUT)
    start = time.perf_counter()
    relay.run(until_drained=True)
    return {"counts": relay.counts, "start": start, "end": time.perf_counter()}


@contextmanager
def endpoint() -> Iterator[tuple[str, Counter[str]]]:
    """A no-op HTTP endpoint on 127.0.0.1 answering 204; its URL and the count of each key."""
    keys: Counter[str] = Counter()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                keys[self.headers.get("Idempotency-Key", "")] += 1
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/noop", keys
    finally:
        server.shutdown()
        server.server_close()


def _span(out: list[dict[str, Any]]) -> float:
    return max(r["end"] for r in out) - min(r["start"] for r in out)


def run(bench: Any, log: Callable[[str], None]) -> None:
    """Measure both parts ``Sizes.rounds`` times; the best round of each is kept."""
    s, results = bench.sizes, bench.results.outbox
    n, w = s.outbox_tasks, s.outbox_workers
    results.update(tasks=n, workers=w, relay_batch=s.outbox_relay_batch)
    with endpoint() as (url, keys):
        for round_ in range(s.rounds):
            for label, target in (("plain", None), ("outbox", url)):
                bench.clear()
                bench.sql(f"TRUNCATE {OUTBOX} RESTART IDENTITY")
                bench.insert_tasks("'outbox:' || g", "'pending'", "'default'", "0", "NULL", 1, n)
                bench.sql("VACUUM ANALYZE django_taskclaim_task")
                out = run_workers(drain_fenced, w, (target,))
                executed = [e for r in out for e in r["executed"]]
                if sorted(executed) != sorted(set(executed)) or len(executed) != n:
                    raise RuntimeError(f"outbox drain ({label}): {len(set(executed))} distinct of {len(executed)}")
                value = n / _span(out)
                results[f"drain_{label}"] = max(value, results.get(f"drain_{label}", 0.0))
                log(f"  outbox drain {label} round {round_ + 1}/{s.rounds}: {value:,.0f} tasks/s (W={w})")
            messages = bench.sql(f"SELECT count(*) FROM {OUTBOX} WHERE status = 'pending'")[0][0]
            if messages != n:
                raise RuntimeError(f"outbox drain: {messages} messages recorded for {n} tasks")
            keys.clear()
            out = run_workers(relay, w, (s.outbox_relay_batch,))
            delivered = bench.sql(f"SELECT count(*) FROM {OUTBOX} WHERE status = 'delivered'")[0][0]
            if delivered != n or len(keys) != n:
                raise RuntimeError(f"relays: {delivered} delivered, {len(keys)} keys received, of {n}")
            results["sent_twice"] = results.get("sent_twice", 0) + sum(1 for c in keys.values() if c > 1)
            value = n / _span(out)
            results["relay"] = max(value, results.get("relay", 0.0))
            log(f"  relays round {round_ + 1}/{s.rounds}: {value:,.0f} messages/s (W={w})")


def markdown(r: dict[str, Any]) -> list[str]:
    """The report's section (empty when the phase did not run)."""
    if not r:
        return []
    plain, outbox = r["drain_plain"], r["drain_outbox"]
    cost_ms = (1 / outbox - 1 / plain) * 1000 * r["workers"]
    return [
        "## Outbox (tasks/s, messages/s)",
        "",
        f"A queue drain of {r['tasks']:,} no-op tasks by W = {r['workers']} processes, each completion inside "
        "`claim.fenced()`, without and with one `claim.outbox.http()` message per task (one more row in the "
        f"same commit); then W = {r['workers']} relays (`taskclaim_relay`'s loop, batch {r['relay_batch']}) "
        "deliver those messages to a no-op HTTP endpoint on 127.0.0.1 (stdlib server, one connection a "
        "request). Best round of each.",
        "",
        "| drain, no message | drain, one message a task | with/without | cost per task (ms of a worker) "
        "| relay delivery | messages sent twice |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {plain:,.0f} | {outbox:,.0f} | {outbox / plain:.2f} | {cost_ms:.2f} | {r['relay']:,.0f} "
        f"| {r.get('sent_twice', 0)} |",
        "",
    ]
