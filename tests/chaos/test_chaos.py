"""The fault-injection harness: its checker on hand-made histories, and short runs of it.

The short runs are the CI version of ``python -m tests.chaos`` (docs/fault-injection.md): real
worker processes, real signals, a PostgreSQL server of the harness's own that it restarts.
Each runs on the database of the current suite run.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.checker import check
from tests.chaos.harness import FAULTS, applicable_faults

ROOT = Path(__file__).resolve().parents[2]
DB = os.environ.get("TASKCLAIM_TEST_DB", "sqlite")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def attempt(task: int, token: int, start: float, end: float | None, outcome: str,
            stale: int = 0, owner: str = "w0:100") -> dict[str, Any]:
    return {"id": task * 100 + token, "task_id": task, "token": token, "owner": owner,
            "started_at": at(start), "ended_at": None if end is None else at(end),
            "outcome": outcome, "stale_writes": stale}


def effect(pk: int, key: str, token: int, when: float, final: bool = True) -> dict[str, Any]:
    return {"id": pk, "task_key": key, "token": token, "created_at": at(when),
            "worker": "w0:100#final" if final else "w0:100#step0"}


def history() -> dict[str, Any]:
    """One task, taken over once: token 1 expired at 3 s, token 2 wrote and completed."""
    return {
        "tasks": [{"id": 1, "key": "k", "status": "succeeded", "fencing_token": 2, "attempts": 2}],
        "attempts": [attempt(1, 1, 0, 3, "taken_over"), attempt(1, 2, 3, 5, "succeeded")],
        "effects": [effect(1, "k", 1, 1, final=False), effect(2, "k", 2, 4, final=False),
                    effect(3, "k", 2, 4.5)],
    }


def events(expiry: float = 2.0) -> list[dict[str, Any]]:
    return [{"event": "claimed", "task": 1, "token": 1, "expires": str(at(expiry))},
            {"event": "claimed", "task": 1, "token": 2, "expires": str(at(5))}]


def violations(state: dict[str, Any], evs: list[dict[str, Any]] | None = None,
               killed: set[int] | None = None) -> dict[str, list[str]]:
    verdict = check(state, events() if evs is None else evs, ["k"], killed or set())
    return {k: v for k, v in verdict.violations.items() if v}


def test_checker_passes_a_correct_history() -> None:
    verdict = check(history(), events(), ["k"], set())
    assert verdict.ok, verdict.violations
    assert verdict.figures["effects_accepted"] == 1
    assert verdict.figures["executions_started"] == 2
    assert verdict.figures["takeovers"] == 1


def test_checker_finds_a_lost_task() -> None:
    state = history()
    state["tasks"][0]["status"] = "pending"
    assert "lost" in violations(state)
    assert "lost" in violations(history() | {"tasks": []})
    assert "lost" in violations(history() | {"effects": history()["effects"][:2]})


def test_checker_finds_a_duplicated_effect() -> None:
    state = history()
    state["effects"].append(effect(4, "k", 2, 4.8))
    found = violations(state)
    assert list(found) == ["duplicated"], found


def test_checker_finds_tokens_going_down_in_commit_order() -> None:
    state = history()
    # Token 1 wrote after token 2 had: a fenced-off write that landed.
    state["effects"].insert(2, effect(5, "k", 1, 2.9, final=False))
    state["effects"].sort(key=lambda e: (e["id"] != 5, e["id"]))
    state["effects"] = [state["effects"][1], state["effects"][2], state["effects"][0],
                        state["effects"][3]]
    assert "token order" in violations(state)


def test_checker_finds_an_effect_outside_its_claim() -> None:
    state = history()
    state["effects"][0] = effect(1, "k", 1, 3.5, final=False)  # after its takeover at 3 s
    assert "effect outside claim" in violations(state)


def test_checker_finds_overlapping_claims() -> None:
    state = history()
    state["attempts"][0] = attempt(1, 1, 0, 3.5, "taken_over")  # ended after token 2 began
    assert "overlap" in violations(state)
    # Taken over at 3 s although a heartbeat had extended its lease to 3.2 s.
    assert "overlap" in violations(history(), events(expiry=3.2))
    state = history()
    state["attempts"][1]["outcome"] = "running"
    assert "overlap" in violations(state)


def test_checker_counts_refused_writes() -> None:
    stale = [{"event": "stale", "task": 1, "token": 1, "action": "heartbeat"}]
    # Reported by the worker but not recorded.
    assert "stale count" in violations(history(), events() + stale)
    state = history()
    state["attempts"][0]["stale_writes"] = 1
    assert not violations(state, events() + stale)
    # Recorded, but the (undisturbed) worker never said so.
    assert "stale count" in violations(state)
    # ... which is fine when its reply could be lost: it was killed, or its connection failed.
    assert not violations(state, killed={100})
    assert not violations(state, events() + [{"event": "dberror", "task": 1, "token": 1}])


def claimed(token: int, expires: float, owner: str = "w0:100") -> dict[str, Any]:
    return {"event": "claimed", "task": 1, "key": "k", "token": token, "owner": owner,
            "expires": str(at(expires))}


def seen_committed() -> list[dict[str, Any]]:
    """What the worker of history() reported: both claims, then token 2's effects."""
    return [claimed(1, 2), claimed(2, 5),
            {"event": "step", "key": "k", "token": 2, "owner": "w0:100", "step": 0},
            {"event": "done", "key": "k", "token": 2, "owner": "w0:100"}]


def test_checker_passes_what_the_workers_saw_committed() -> None:
    verdict = check(history(), seen_committed(), ["k"], set())
    assert verdict.ok, verdict.violations
    assert verdict.figures["claims_seen"] == 2
    assert verdict.figures["claims_lost"] == verdict.figures["effects_lost"] == 0


def test_checker_finds_a_claim_seen_committed_but_missing() -> None:
    # A third claim the worker was told had committed: the final state never heard of it.
    found = violations(history(), seen_committed() + [claimed(3, 8)])
    assert "commit lost" in found and "token 3" in found["commit lost"][0], found
    # Token 2 was granted to another owner than the one told so: the claim it saw is gone.
    found = violations(history(), [claimed(1, 2), claimed(2, 5, owner="w9:900")])
    assert "commit lost" in found and "w0:100's" in found["commit lost"][0], found


def test_checker_finds_an_effect_seen_committed_but_missing() -> None:
    step = {"event": "step", "key": "k", "token": 1, "owner": "w0:100", "step": 1}
    found = violations(history(), seen_committed() + [step])
    assert list(found) == ["commit lost"], found
    assert "w0:100#step1" in found["commit lost"][0]


def test_checker_finds_a_token_granted_twice_or_going_down() -> None:
    found = violations(history(), seen_committed() + [claimed(2, 6, owner="w9:900")])
    assert any("token 2 granted 2 times" in m for m in found["token reused"]), found
    # Token 1 granted after token 2 (on the database clock): a server that forgot token 2.
    found = violations(history(), [claimed(2, 5), claimed(1, 7)])
    assert any("after token 2" in m for m in found["token reused"]), found


def test_checker_counts_a_lost_final_effect_done_again_as_duplicated() -> None:
    """Token 1's worker saw its effect and completion commit; the server that had them died,
    and token 2 did the task again: one effect in the database, two in the world."""
    done1 = {"event": "done", "key": "k", "token": 1, "owner": "w0:100"}
    verdict = check(history(), seen_committed() + [done1], ["k"], set())
    assert verdict.figures["duplicated"] == 1 and verdict.figures["effects_lost"] == 1
    assert verdict.violations["duplicated"] and verdict.violations["commit lost"]


def test_checker_reports_a_server_that_forgot_tasks_without_failing_itself() -> None:
    """An asynchronous standby's failover: tasks, claims and effects gone, ids given again."""
    state = history()
    state["tasks"] = []
    events = seen_committed() + [claimed(1, 9, owner="w1:101"),
                                 {"event": "stale", "key": "gone", "token": 1, "action": "heartbeat"}]
    verdict = check(state, events, ["k", "gone"], set())
    assert verdict.figures["lost"] == 2
    assert verdict.figures["claims_lost"] == 3 and verdict.figures["tokens_reused"] == 1
    assert not verdict.ok


def test_checker_counts_step_calls_and_finds_a_step_called_again_once_stored() -> None:
    """Step 0 stored by token 2; token 1 called it and died before storing (the window)."""
    state = history() | {"steps": [{"task_id": 1, "name": "step0", "token": 2}]}
    calls = [{"event": "step_call", "key": "k", "token": 1, "step": "step0"},
             {"event": "step_call", "key": "k", "token": 2, "step": "step0"}]
    verdict = check(state, [*events(), *calls], ["k"], set())
    assert verdict.ok, verdict.violations
    assert (verdict.figures["steps_stored"], verdict.figures["step_calls"], verdict.figures["step_calls_rerun"],
            verdict.figures["step_calls_twice"]) == (1, 2, 1, 0)
    for again in (2, 3):  # called again by the token that stored it, or by a later one
        state["steps"] = [{"task_id": 1, "name": "step0", "token": 2}]
        found = check(state, [*events(), *calls, {**calls[1], "token": again}], ["k"], set())
        assert found.figures["step_calls_twice"] == 1
        assert "step called twice" in {k for k, v in found.violations.items() if v}


def test_fault_kinds_by_database() -> None:
    assert applicable_faults("sqlite", None) == ["pause", "kill"]
    assert applicable_faults("mariadb", None) == ["pause", "kill"]
    # A failover changes the server itself: only when asked for.
    assert applicable_faults("postgresql", None) == [k for k in FAULTS if k != "failover"]
    assert applicable_faults("postgresql", ("failover", "kill")) == ["kill", "failover"]
    with pytest.raises(ValueError, match="do not apply to mariadb"):
        applicable_faults("mariadb", ("failover",))
    with pytest.raises(ValueError, match="do not apply to sqlite"):
        applicable_faults("sqlite", ("restart",))
    with pytest.raises(ValueError, match="unknown fault kind"):
        applicable_faults("postgresql", ("meteor",))


def chaos(tmp_path: Path, *args: str, timeout: float) -> tuple[int, str, dict[str, Any]]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "TASKCLAIM_TEST_DB_NAME")}
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "tests.chaos", "--db", DB, "--report", str(report), *args],
        cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=timeout)
    out = result.stdout + result.stderr
    return result.returncode, out, json.loads(report.read_text()) if report.exists() else {}


def require_binaries() -> None:
    from devtools.servers import postgres_bindir
    from tests.chaos.harness import FAKETIME_LIB
    from tests.conftest import requirement_missing

    if DB == "postgresql" and postgres_bindir() is None:
        requirement_missing("PostgreSQL server binaries")
    if DB in ("postgresql", "mariadb") and not os.path.exists(FAKETIME_LIB):
        requirement_missing("libfaketime")


@pytest.mark.slow
def test_short_run_injects_every_fault_and_passes(tmp_path: Path) -> None:
    require_binaries()
    duration = "15" if DB == "postgresql" else "10"
    code, out, report = chaos(
        tmp_path, "--duration", duration, "--workers", "4", "--seed", "7",
        "--fault-interval", "0.7",
        "--crash", "after_claim=0.05,before_commit=0.05,after_commit=0.05", timeout=240)
    assert code == 0, out
    assert report["ok"] and not report["violations"], out
    faults = report["faults"]
    for kind in applicable_faults(DB, None):
        # Caught in the act only when a worker is inside its completing transaction: tried.
        name = "terminate_in_commit_tried" if kind == "terminate_in_commit" else kind
        assert faults.get(name, 0) > 0, f"{kind} never injected\n{out}"
    if DB in ("postgresql", "mariadb"):
        assert faults.get("skewed_worker", 0) > 0, out
    figures = report["figures"]
    assert figures["effects_accepted"] == figures["tasks_enqueued"] > 0, out
    assert figures["executions_started"] >= figures["tasks_enqueued"], out
    assert figures["lost"] == figures["duplicated"] == figures["overlaps"] == 0, out
    # Every task's durable steps (all but the last of its three) stored; none called again once stored.
    assert figures["steps_stored"] >= 2 * figures["tasks_enqueued"] and figures["step_calls_twice"] == 0, out


@pytest.mark.slow
def test_short_run_of_workers_with_several_tasks_in_hand_passes(tmp_path: Path) -> None:
    """``--concurrency 4``: each worker process holds four claims at once, so every SIGKILL and
    SIGSTOP strikes four; the checker still finds every effect once, within its claim."""
    require_binaries()
    code, out, report = chaos(
        tmp_path, "--duration", "8", "--workers", "3", "--concurrency", "4", "--seed", "12",
        "--faults", "pause,kill", "--fault-interval", "0.7", timeout=180)
    assert code == 0, out
    assert report["ok"] and not report["violations"], out
    assert report["faults"].get("kill", 0) > 0 and report["faults"].get("pause", 0) > 0, out
    figures = report["figures"]
    assert figures["effects_accepted"] == figures["tasks_enqueued"] > 0, out
    assert figures["lost"] == figures["duplicated"] == figures["overlaps"] == 0, out


@pytest.mark.slow
def test_short_run_fails_when_effects_are_not_fenced(tmp_path: Path) -> None:
    """The checker is not a rubber stamp: effects written outside fenced() are caught doubled."""
    if DB != "sqlite":
        pytest.skip("one database suffices to show the checker failing (kept to the CI budget)")
    code, out, report = chaos(
        tmp_path, "--duration", "8", "--workers", "6", "--seed", "3", "--faults", "pause",
        "--fault-interval", "0.7", "--work-ms", "400", "--unsafe", timeout=180)
    assert code == 1, out
    assert report["figures"]["duplicated"] > 0, out
    assert "duplicated" in report["violations"] and "FAIL" in out, out


@pytest.mark.slow
@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_short_celery_run_passes(tmp_path: Path, broker: str) -> None:
    """Celery workers through the bridge, killed and paused, the broker restarted."""
    if DB != "postgresql":
        pytest.skip("run on PostgreSQL only (kept to the CI budget)")
    import shutil

    from tests.conftest import require_module, requirement_missing

    require_module("django_taskclaim.celery", "the Celery bridge (pip install 'django-taskclaim[celery]')")
    if shutil.which("redis-server") is None:
        requirement_missing("redis-server")
    if broker == "rabbitmq" and not os.path.exists("/usr/lib/rabbitmq/bin/rabbitmq-server"):
        requirement_missing("rabbitmq-server")
    require_binaries()
    code, out, report = chaos(tmp_path, "--celery", "--broker", broker, "--duration", "12",
                              "--workers", "3", "--seed", "11", "--fault-interval", "0.8", timeout=240)
    assert code == 0, out
    assert report["ok"] and not report["violations"] and report["broker"] == broker, out
    for kind in ("pause", "kill", "kill_worker", "broker_restart"):
        assert report["faults"].get(kind, 0) > 0, f"{kind} never injected\n{out}"
    figures = report["figures"]
    assert figures["effects_accepted"] == figures["tasks_enqueued"] > 0, out
