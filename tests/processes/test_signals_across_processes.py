"""Signals fire once per event across several worker processes.

Each worker (``python -m tests.programs.signal_recorder worker``) records every signal it sends to
a file of its own while competing for the same keys. The test then checks the signal records
against the ``Attempt`` rows the database wrote: one ``task_claimed`` per claim row, one
``task_taken_over`` per taken-over row, one ``duplicate_delivery`` per duplicate row, one
``stale_write_refused`` per counted fenced-off write, and so on. Nothing is sent twice (by two
processes, or twice by one) and nothing is missed.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from devtools.processes import Supervisor
from tests.programs.signal_recorder import SIGNAL_NAMES


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_signals_once_per_event_across_processes(processes: Supervisor, tmp_path: Path) -> None:
    from django.db.models import Sum

    from django_taskclaim.models import Attempt, Task

    keys, lease = 6, 0.4
    prefix = tmp_path / "signals"
    procs = [processes.start("tests.programs.signal_recorder", "worker", "--keys", str(keys), "--lease", str(lease),
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
