"""The harness's ``--downstream`` mode: its checker on hand-made histories, and a short run.

The short run is the CI form of ``python -m tests.chaos --downstream`` (docs/fault-injection.md):
real workers calling a real HTTP server (``fenced_endpoint``, its own SQLite database) directly
and through the outbox, ``taskclaim_relay`` processes delivering, SIGSTOP and SIGKILL on both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.downstream import DIRECT, check_downstream

ROOT = Path(__file__).resolve().parents[2]
DB = os.environ.get("TASKCLAIM_TEST_DB", "sqlite")


def history() -> dict[str, Any]:
    """Task k taken over once (token 1 fenced off), completed by token 2: both effects once, the
    fenced-off owner's direct call refused."""
    return {
        "tasks": [{"id": 1, "key": "k", "status": "succeeded", "fencing_token": 2, "attempts": 2}],
        "outbox": [{"id": 1, "task_key": "k", "token": 2, "effect": "chaos", "status": "delivered",
                    "attempts": 2, "answer_status": 201}],
        "effects": [{"task_key": "k" + DIRECT, "token": 2}, {"task_key": "k", "token": 2}],
        "events": [{"event": "direct", "key": "k", "token": 2, "status": 201},
                   {"event": "direct", "key": "k", "token": 1, "status": 409}],
    }


def judge(h: dict[str, Any]) -> tuple[dict[str, int], dict[str, list[str]]]:
    figures, found = check_downstream(h["tasks"], h["outbox"], h["effects"], h["events"], ["k"])
    return figures, {k: v for k, v in found.items() if v}


def test_checker_passes_a_correct_history() -> None:
    figures, found = judge(history())
    assert not found, found
    assert figures["downstream_outbox_effects"] == figures["downstream_direct_effects"] == 1
    assert figures["direct_calls_refused_409"] == 1


def test_checker_finds_an_effect_lost_downstream() -> None:
    for lost in ("k", "k" + DIRECT):
        h = history()
        h["effects"] = [e for e in h["effects"] if e["task_key"] != lost]
        assert list(judge(h)[1]) == ["downstream lost"], lost


def test_checker_finds_an_effect_taken_twice_downstream() -> None:
    for twice in ("k", "k" + DIRECT):
        h = history()
        h["effects"].append({"task_key": twice, "token": 2})
        assert "downstream twice" in judge(h)[1], twice
    h = history()  # an outbox effect of a task that never completed
    h["tasks"][0]["status"] = "pending"
    assert "downstream twice" in judge(h)[1]


def test_checker_finds_a_message_not_delivered_or_recorded_twice() -> None:
    h = history()
    h["outbox"][0]["status"] = "failed"
    assert "outbox" in judge(h)[1]
    h = history()
    h["outbox"].append({**h["outbox"][0], "id": 2, "token": 1})
    assert "outbox" in judge(h)[1]


def test_checker_finds_a_fenced_off_call_that_took_effect() -> None:
    h = history()
    h["effects"][0]["token"] = 1  # the direct effect is the refused owner's
    assert "fenced-off call" in judge(h)[1]
    h = history()
    h["events"][0]["status"] = 409  # the completing owner refused
    assert "fenced-off call" in judge(h)[1]
    h = history()
    h["effects"][1]["token"] = 1  # the outbox effect carries a token other than the completion's
    assert "downstream token" in judge(h)[1]


def test_short_downstream_run_passes(tmp_path: Path) -> None:
    """Workers paused past their lease and killed, relays too; one step per execution, so a
    pause lands before the direct call and the woken owner calls with its old token."""
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "tests.chaos", "--db", DB, "--report", str(report), "--downstream",
         "--duration", "4", "--workers", "4", "--seed", "6", "--faults", "pause,kill",
         "--fault-interval", "0.4", "--steps", "1", "--work-ms", "300", "--lease", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    figures = json.loads(report.read_text())["figures"]
    assert figures["tasks_enqueued"] > 0
    assert figures["downstream_outbox_effects"] == figures["tasks_enqueued"], out
    assert figures["downstream_direct_effects"] == figures["tasks_enqueued"], out
    assert figures["downstream_lost"] == figures["downstream_twice"] == 0, out
    assert figures["direct_calls"] >= figures["tasks_enqueued"], out
    assert figures["relay_kills"] + figures["relay_pauses"] > 0, out


@pytest.mark.skipif(DB != "sqlite", reason="the checker is the same on every database: SQLite only")
def test_short_downstream_run_fails_with_a_key_per_owner(tmp_path: Path) -> None:
    """``--unsafe --downstream``: each owner calls with an idempotency key of its own (its token
    in the effect name) and works after the call; a takeover then takes the effect twice, and
    the downstream's checker must say so."""
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "tests.chaos", "--db", DB, "--report", str(report), "--downstream",
         "--unsafe", "--duration", "5", "--workers", "5", "--seed", "3", "--faults", "pause",
         "--fault-interval", "0.4", "--steps", "1", "--work-ms", "400", "--lease", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    found = json.loads(report.read_text())["violations"]
    assert "downstream twice" in found, out
