"""The harness's ``--schedules`` mode: its checker (**every tick exactly once**) on hand-made
histories, and the short run of CI on the database of the current suite run
(docs/fault-injection.md)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.test_chaos import DB, chaos, require_binaries
from tests.chaos.ticks import check_ticks, schedule

T0 = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC)


def tick(n: int) -> dt.datetime:
    return T0 + dt.timedelta(seconds=n)


def history(n: int = 5) -> dict[str, Any]:
    """Ticks 0 to n-1, each created at its time, claimed 10 ms after it and run once."""
    spec = schedule()
    state: dict[str, Any] = {"tasks": [], "attempts": [], "effects": []}
    for i in range(n):
        key = spec.key(tick(i))
        state["tasks"].append({"id": i, "key": key, "status": "succeeded", "created_at": tick(i)})
        state["attempts"].append({"task_id": i, "token": 1, "started_at": tick(i) + dt.timedelta(milliseconds=10)})
        state["effects"].append({"task_key": key, "worker": "w0:100#final"})
    return state


def judge(state: dict[str, Any], first: dt.datetime | None = T0, until: dt.datetime | None = None,
          reported: int = 0) -> tuple[dict[str, int], dict[str, list[str]]]:
    figures, found = check_ticks(state["tasks"], state["attempts"], state["effects"], first,
                                 tick(4) if until is None else until, reported)
    return figures, {k: v for k, v in found.items() if v}


def test_checker_passes_every_tick_once() -> None:
    figures, found = judge(history(), reported=5)
    assert not found, found
    assert figures["ticks_expected"] == figures["ticks_fired"] == figures["tick_claims"] == 5
    assert figures["ticks_late"] == 0
    # Fired on past the last tick due (while the schedulers stopped), and one older than the first
    # the harness saw (a scheduler that started before the skewed one had fired): both expected.
    figures, found = judge(history(7), first=tick(2))
    assert not found and figures["ticks_expected"] == 7, found
    # A tick caught up late (its task created 3 s after its time) is counted, not refused.
    state = history()
    state["tasks"][2]["created_at"] = tick(5)
    state["tasks"][3]["created_at"] = tick(1)  # and one 2 s early, by a scheduler whose clock is ahead
    figures, found = judge(state)
    assert not found and figures["ticks_late"] == figures["ticks_ahead"] == 1, found


def test_checker_finds_a_missing_tick() -> None:
    state = history()
    del state["tasks"][2]
    found = judge(state)[1]
    assert list(found) == ["tick missing"] and "12%3A00%3A02" in found["tick missing"][0], found
    # The last tick due has no task (the schedulers stopped firing before the end).
    assert list(judge(history(), until=tick(6))[1]) == ["tick missing"]
    # No tick fired at all.
    assert list(judge({"tasks": [], "attempts": [], "effects": []}, first=None)[1]) == ["tick missing"]


def test_checker_finds_a_tick_twice() -> None:
    """The negative check: a second task for one tick, or more ticks created than there are."""
    state = history()
    state["tasks"].append({**state["tasks"][1], "id": 99})
    assert "tick twice" in judge(state)[1]
    assert list(judge(history(), reported=6)[1]) == ["tick twice"]


def test_checker_finds_a_tick_not_run_run_twice_or_early() -> None:
    state = history()
    state["tasks"][1]["status"] = "pending"
    assert list(judge(state)[1]) == ["tick not run"]
    state = history()
    state["effects"].append(dict(state["effects"][3]))
    assert list(judge(state)[1]) == ["tick ran twice"]
    state = history()
    state["effects"].pop(0)
    assert list(judge(state)[1]) == ["tick not run"]
    state = history()
    state["attempts"][4]["started_at"] = tick(4) - dt.timedelta(milliseconds=5)
    assert list(judge(state)[1]) == ["tick early"]


@pytest.mark.slow
def test_short_run_with_schedules_fires_every_tick_once(tmp_path: Path) -> None:
    """Three schedulers of a 1 s schedule among the workers, paused and killed (the first pause and
    kill go to a scheduler), all of them paused at once half-way, one 2 s ahead where the database's
    clock decides; on PostgreSQL the server restarted besides."""
    require_binaries()
    faults = "pause,kill,restart" if DB == "postgresql" else "pause,kill"
    code, out, report = chaos(
        tmp_path, "--schedules", "--duration", "6", "--workers", "2", "--faults", faults,
        "--fault-interval", "0.7", "--lease", "1", "--seed", "5", timeout=240)
    assert code == 0, out
    assert report["ok"] and not report["violations"], out
    figures = report["figures"]
    assert figures["ticks_fired"] >= figures["ticks_expected"] >= 5, out
    assert figures["ticks_missing"] == figures["ticks_twice"] == figures["ticks_run_twice"] == 0, out
    assert figures["scheduler_kills"] > 0 and figures["scheduler_pauses"] > 0, out
    assert figures["scheduler_outages"] == 1, out
    assert figures["skewed_schedulers"] == (1 if DB in ("postgresql", "mariadb") else 0), out
    assert figures["effects_accepted"] == figures["tasks_enqueued"], out
    if DB == "postgresql":
        assert report["faults"].get("restart", 0) > 0, out
