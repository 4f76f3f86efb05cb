"""Signals fire once per event, in one process and across several worker processes.

The multi-process test runs this module as a worker program (``python -m tests.core.test_signals
worker``): each worker connects receivers that append one JSON line per signal to a file of
its own, then competes for the same keys. The parent then checks the signal records against
the ``Attempt`` rows the database wrote: one ``task_claimed`` per claim row, one
``task_taken_over`` per taken-over row, one ``duplicate_delivery`` per duplicate row, one
``stale_write_refused`` per counted fenced-off write, and so on. Nothing is sent twice (by
two processes, or twice by one) and nothing is missed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from devtools.events import emit
from devtools.processes import Supervisor

SIGNAL_NAMES = ("task_claimed", "task_taken_over", "heartbeat_lost", "task_completed",
                "task_failed", "task_released", "stale_write_refused", "duplicate_delivery",
                "tasks_reclaimed")


def describe(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A JSON-able record of one signal."""
    record: dict[str, Any] = {"signal": name, "pid": os.getpid()}
    claim = kwargs.get("claim")
    if claim is not None:
        record.update(key=claim.key, tenant=claim.tenant, token=claim.token, owner=claim.owner)
    task = kwargs.get("task")
    if task is not None:
        record.update(key=task.key, tenant=task.tenant, owner=kwargs["owner"],
                      delivery_id=kwargs["delivery_id"])
    for field in ("key", "tenant", "token", "owner", "action", "takeover", "retry",
                  "previous_owner", "previous_token", "tasks"):
        if field in kwargs and field not in record:
            value = kwargs[field]
            record[field] = [list(row) for row in value] if field == "tasks" else value
    return record


def connect_recorder(sink: Any) -> list[Any]:
    """Connect a receiver to every signal that passes ``describe(...)`` records to ``sink``."""
    from django_taskclaim import signals

    receivers = []
    for name in SIGNAL_NAMES:
        def receiver(sender: Any, _name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            sink(describe(_name, kwargs))

        getattr(signals, name).connect(receiver, weak=False, dispatch_uid=f"test-recorder-{name}")
        receivers.append(receiver)
    return receivers


def disconnect_recorder() -> None:
    from django_taskclaim import signals

    for name in SIGNAL_NAMES:
        getattr(signals, name).disconnect(dispatch_uid=f"test-recorder-{name}")


# -- the worker program ------------------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connection

    from django_taskclaim.exceptions import StaleClaim
    from django_taskclaim.models import Task

    log = open(f"{args.log}.{os.getpid()}.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    def sink(record: dict[str, Any]) -> None:
        log.write(json.dumps(record) + "\n")
        log.flush()

    connect_recorder(sink)
    me = f"sig-{os.getpid()}"
    keys = [f"sig-{i}" for i in range(args.keys)]
    connection.ensure_connection()
    emit(event="ready")
    sys.stdin.readline()
    done: set[str] = set()
    deliveries = 0
    deadline = time.monotonic() + 60
    while len(done) < len(keys) and time.monotonic() < deadline:
        for key in keys:
            if key in done:
                continue
            deliveries += 1
            outcome = Task.objects.claim(key, owner=me, lease=args.lease,
                                         delivery_id=f"{me}-{deliveries}")
            if not outcome.claimed:
                if outcome.task.is_terminal:
                    done.add(key)
                continue
            claim = outcome.claim
            assert claim is not None
            n = int(key.rsplit("-", 1)[1])
            if claim.token == 1 and n % 3 == 0:
                # The first owner stalls past its lease until another worker has taken over
                # (the token moved on), so this one's completion is refused (a fenced-off write).
                until = time.monotonic() + 30
                while Task.objects.filter(pk=claim.task_id, fencing_token=claim.token).exists():
                    assert time.monotonic() < until, f"nobody took {key} over"
                    time.sleep(0.02)  # a poll of the task row, with the deadline above
            elif claim.token == 1 and n % 3 == 1:
                claim.fail("first attempt fails", retry=True)
                continue
            try:
                claim.complete({"by": me})
                done.add(key)
            except StaleClaim:
                pass
        time.sleep(0.02)  # idle poll between rounds
    log.close()
    emit(event="exit", done=len(done))


# -- the tests ---------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_signals_once_per_event_across_processes(processes: Supervisor, tmp_path: Path) -> None:
    from django.db.models import Sum

    from django_taskclaim.models import Attempt, Task

    keys, lease = 6, 0.4
    prefix = tmp_path / "signals"
    procs = [processes.start("tests.core.test_signals", "worker", "--keys", str(keys), "--lease", str(lease),
                             "--log", str(prefix)) for _ in range(3)]
    processes.go(*procs)
    for proc in procs:
        assert proc.finish(90) == {"event": "exit", "done": keys}

    records = [json.loads(line) for path in tmp_path.glob("signals.*.jsonl")
               for line in path.read_text().splitlines()]
    by_signal: dict[str, list[dict[str, Any]]] = {name: [] for name in SIGNAL_NAMES}
    for record in records:
        by_signal[record["signal"]].append(record)
    assert len({r["pid"] for r in records}) == 3  # every worker sent some

    attempts = list(Attempt.objects.select_related("task"))
    claims = [a for a in attempts if a.token is not None]

    def pairs(rows: list[Any]) -> Counter[tuple[str, int]]:
        return Counter((a.task.key, a.token) for a in rows)

    def sent(name: str, field: str = "token") -> Counter[tuple[str, int]]:
        return Counter((r["key"], r[field]) for r in by_signal[name])

    # One task_claimed per claim row, flagged as a takeover exactly when it took one over.
    assert sent("task_claimed") == pairs(claims)
    taken = [a for a in claims if a.outcome == "taken_over"]
    took = Counter((a.task.key, a.token + 1) for a in taken)
    takeovers = by_signal["task_claimed"]
    assert Counter((r["key"], r["token"]) for r in takeovers if r["takeover"]) == took
    # One task_taken_over per taken-over row, naming the previous token and owner.
    assert sent("task_taken_over", "previous_token") == pairs(taken)
    owners = {(a.task.key, a.token): a.owner for a in claims}
    for r in by_signal["task_taken_over"]:
        assert r["previous_owner"] == owners[(r["key"], r["previous_token"])]
    # Completed, failed: once per attempt that ended so.
    assert sent("task_completed") == pairs([a for a in claims if a.outcome == "succeeded"])
    assert sent("task_failed") == pairs([a for a in claims if a.outcome in ("retry", "failed")])
    # Fenced-off writes: the signal count equals the counter the database kept.
    stale = Counter({(a.task.key, a.token): a.stale_writes for a in claims if a.stale_writes})
    assert sent("stale_write_refused") == stale
    # Duplicate deliveries: one per duplicate row, with the same delivery id.
    dups = [a for a in attempts if a.outcome == "duplicate"]
    dup_sent = Counter((r["key"], r["delivery_id"]) for r in by_signal["duplicate_delivery"])
    assert dup_sent == Counter((a.task.key, a.delivery_id) for a in dups)
    assert not by_signal["task_released"] and not by_signal["tasks_reclaimed"]

    # The run exercised every kind of event it checks (so the equalities above mean something).
    assert Task.objects.succeeded().count() == keys
    assert len(taken) >= 1 and len(dups) >= 1
    assert Attempt.objects.aggregate(n=Sum("stale_writes"))["n"] >= 1
    assert len(by_signal["task_failed"]) == 2  # keys 1 and 4 fail their first attempt


@pytest.fixture
def recorded():  # type: ignore[no-untyped-def]
    records: list[dict[str, Any]] = []
    lock = threading.Lock()

    def sink(record: dict[str, Any]) -> None:
        with lock:
            records.append(record)

    connect_recorder(sink)
    yield records
    disconnect_recorder()


def names(records: list[dict[str, Any]]) -> list[str]:
    return [r["signal"] for r in records]


@pytest.mark.django_db(transaction=True)
def test_claim_complete_and_duplicate(recorded) -> None:  # type: ignore[no-untyped-def]
    from django_taskclaim.models import Task

    claim = Task.objects.claim("s-1", tenant="t", owner="a", lease=60).claim
    assert claim
    Task.objects.claim("s-1", tenant="t", owner="b", delivery_id="m-2")
    claim.complete({"x": 1}, result_ref="ref")
    assert names(recorded) == ["task_claimed", "duplicate_delivery", "task_completed"]
    assert recorded[0] | {"pid": 0} == {"signal": "task_claimed", "pid": 0, "key": "s-1",
                                        "tenant": "t", "token": 1, "owner": "a", "takeover": False}
    assert recorded[1]["owner"] == "b" and recorded[1]["delivery_id"] == "m-2"


@pytest.mark.django_db(transaction=True)
def test_operator_release_and_reclaim(recorded) -> None:  # type: ignore[no-untyped-def]
    from django_taskclaim.models import Task
    from tests.conftest import expire

    for key in ("r-1", "r-2"):
        Task.objects.claim(key, tenant="t", lease=600)
    recorded.clear()
    assert Task.objects.filter(key__startswith="r-").force_release() == 2
    assert sorted((r["signal"], r["key"], r["tenant"]) for r in recorded) == [
        ("task_released", "r-1", "t"), ("task_released", "r-2", "t")]
    recorded.clear()
    for key in ("e-1", "e-2"):
        c = Task.objects.claim(key, lease=600).claim
        expire(c)
    recorded.clear()
    assert Task.objects.reclaim_expired() == 2
    assert names(recorded) == ["tasks_reclaimed"]  # one signal for the whole batch
    assert sorted(row[0] for row in recorded[0]["tasks"]) == ["e-1", "e-2"]
    assert {row[3] for row in recorded[0]["tasks"]} == {"pending"}


@pytest.mark.django_db(transaction=True)
def test_no_signal_for_a_rolled_back_claim(recorded) -> None:  # type: ignore[no-untyped-def]
    from django.db import transaction

    from django_taskclaim.models import Task

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        Task.objects.claim("rb-1")
        raise Abort
    assert recorded == []
    assert not Task.objects.filter(key="rb-1").exists()


@pytest.mark.django_db(transaction=True)
def test_heartbeat_lost_and_takeover(recorded) -> None:  # type: ignore[no-untyped-def]
    from django_taskclaim.exceptions import StaleClaim
    from django_taskclaim.models import Task
    from tests.conftest import expire

    claim = Task.objects.claim("hb-1", owner="slow", lease=0.6).claim
    assert claim
    with pytest.raises(StaleClaim), claim.keepalive(interval=0.05):
        expire(claim)
        Task.objects.claim("hb-1", owner="fast")
        assert claim.lost.wait(10), "the keepalive never noticed the takeover"
    assert names(recorded).count("heartbeat_lost") == 1
    assert names(recorded).count("task_taken_over") == 1
    lost = next(r for r in recorded if r["signal"] == "heartbeat_lost")
    assert (lost["key"], lost["token"], lost["owner"]) == ("hb-1", 1, "slow")
    over = next(r for r in recorded if r["signal"] == "task_taken_over")
    assert (over["token"], over["previous_owner"], over["previous_token"]) == (2, "slow", 1)
    stale = [r for r in recorded if r["signal"] == "stale_write_refused"]
    assert [(r["action"], r["token"]) for r in stale] == [("heartbeat", 1)]


@pytest.mark.django_db(transaction=True)
def test_structured_logs(caplog) -> None:  # type: ignore[no-untyped-def]
    from django_taskclaim.exceptions import StaleClaim
    from django_taskclaim.models import Task
    from tests.conftest import expire

    caplog.set_level(logging.INFO, logger="django_taskclaim")
    claim = Task.objects.claim("log-1", tenant="t", owner="w1", lease=60).claim
    assert claim
    expire(claim)
    Task.objects.claim("log-1", tenant="t", owner="w2")
    with pytest.raises(StaleClaim):
        claim.complete()
    records = [r for r in caplog.records if r.name == "django_taskclaim"]
    # The message names the task after its first words (tests/core/test_logs.py); the fields are the same.
    fields = [(r.getMessage().split(":")[0], r.key, r.tenant, r.token, r.owner) for r in records]  # type: ignore[attr-defined]
    assert ("task claimed", "log-1", "t", 1, "w1") in fields
    assert ("task taken over", "log-1", "t", 2, "w2") in fields
    refused = next(r for r in records if r.levelno == logging.WARNING)
    assert (refused.key, refused.token, refused.action) == ("log-1", 1, "complete")  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("worker")
    p.add_argument("--keys", type=int, default=6)
    p.add_argument("--lease", type=float, default=0.4)
    p.add_argument("--log", required=True)
    worker(parser.parse_args())


if __name__ == "__main__":
    main()
