"""``fenced_endpoint`` between real OS processes: concurrent callers, and a worker that wakes up
from SIGSTOP past its lease to call a downstream served over real HTTP."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from django.db import connection

from devtools.polling import wait_until
from devtools.processes import Supervisor
from django_taskclaim.downstream.models import FencingMark, StoredResponse
from django_taskclaim.idempotency import idempotency_key
from django_taskclaim.models import Task
from tests.programs.downstream import post
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

PROGRAM = "tests.programs.downstream"


# SQLite's busy handler sleeps between tries for the write lock: nanosleep, clock_nanosleep.
SLEEP_SYSCALLS = {"x86_64": {"35", "230"}, "aarch64": {"101", "115"}}


def waiting_for_a_lock(pid: int) -> bool:
    """Whether another session waits for a lock (PostgreSQL) or runs a statement on the downstream
    tables (MariaDB: the held view's own session is idle); on SQLite, whether process ``pid`` is
    asleep in SQLite's busy handler (no view of the database shows a wait for its write lock)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND pid <> pg_backend_pid()")
        elif connection.vendor == "mysql":
            cursor.execute("SELECT count(*) FROM information_schema.processlist WHERE id <> CONNECTION_ID() "
                           "AND command = 'Query' AND info LIKE %s", ["%taskclaim_downstream%"])
        else:
            syscall = Path(f"/proc/{pid}/syscall").read_text().split()[0]
            return syscall in SLEEP_SYSCALLS.get(os.uname().machine, set())
        return int(cursor.fetchone()[0]) > 0


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal (state T in /proc)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def test_two_concurrent_calls_with_one_key_run_the_view_once(processes: Supervisor) -> None:
    headers = {"Idempotency-Key": idempotency_key("", "job", "charge"),
               "Taskclaim-Fencing-Key": idempotency_key("", "job"), "Taskclaim-Fencing-Token": "1"}
    first = processes.start(PROGRAM, "call", "/downstream/pay/job/", json.dumps({**headers, "X-Test-Hold": "1"}))
    second = processes.start(PROGRAM, "call", "/downstream/pay/job/", json.dumps(headers))
    processes.go(first)
    first.event("inside", timeout=60)  # the first call's view runs, its transaction open
    processes.go(second)
    second.event("sending", timeout=60)
    # The second call waits for the first's locks, before the first commits.
    wait_until(lambda: second.ended() or waiting_for_a_lock(second.pid), timeout=60,
               what="the second call waiting for the first's lock")
    assert not second.ended(), f"the second call did not wait: {second.events}, {second.stderr()}"
    first.send("release")
    a, b = first.finish(60), second.finish(60)
    assert (a["status"], b["status"]) == (201, 201)
    assert b["body"] == a["body"] and (a["replayed"], b["replayed"]) == ("", "true")
    assert Effect.objects.filter(task_key="job").count() == 1
    assert StoredResponse.objects.count() == 1


def test_a_worker_woken_past_its_lease_is_refused_downstream_over_http(processes: Supervisor) -> None:
    server = processes.start(PROGRAM, "serve")
    url = f"http://127.0.0.1:{server.event('ready', timeout=60)['port']}/downstream/pay/payment-9/"
    old = processes.start(PROGRAM, "worker", "payment-9", url, "2")
    assert old.event("claimed", timeout=60)["token"] == 1
    # It SIGSTOPs itself (before its first heartbeat): no heartbeat, no call, until its lease has run out.
    wait_until(lambda: stopped(old.pid), timeout=60, what="the worker stopped")
    new = wait_until(lambda: Task.objects.claim("payment-9", owner="new", lease=30).claim, timeout=60,
                     what="the stopped worker's lease to expire")
    assert new.token == 2
    status, _ = post(url, new.headers("charge"))
    assert status == 201
    old.cont()
    old.send("call")
    answered = old.event("answered", timeout=60)
    assert answered["status"] == 409 and "older than 2" in answered["body"]
    assert old.finish(60)["event"] == "stale"  # its keepalive saw it was replaced
    # Nothing written downstream by the old owner: one effect, the new owner's.
    assert list(Effect.objects.filter(task_key="payment-9").values_list("token", flat=True)) == [2]
    assert FencingMark.objects.get().token == 2 and StoredResponse.objects.get().fencing_token == 2
