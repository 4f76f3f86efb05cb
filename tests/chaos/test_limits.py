"""The harness's ``--limits`` mode: its checker (**limit never exceeded**) on hand-made histories,
and the short run of CI on the database of the current suite run (docs/fault-injection.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.chaos.checker import check
from tests.chaos.limits import check_limits, limit_of
from tests.chaos.test_chaos import at, chaos, require_binaries


def task(key: str, concurrency_key: str = "k", limit: int = 2) -> dict[str, Any]:
    return {"key": key, "concurrency_key": concurrency_key, "concurrency_limit": limit}


def run(key: str, token: int, start: float, end: float) -> list[dict[str, Any]]:
    """One execution: its start effect and its final effect (database-clock seconds)."""
    return [{"task_key": key, "token": token, "worker": "w0:100#start", "created_at": at(start)},
            {"task_key": key, "token": token, "worker": "w0:100#final", "created_at": at(end)}]


def history() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Key k (limit 2): a and b at once, c as soon as a ended, d (a takeover of b's task by token 2)
    as soon as b's token 1 wrote last; an unlimited task beside them all."""
    tasks = [task("a"), task("b"), task("c"), task("free", concurrency_key="", limit=0)]
    effects = [*run("a", 1, 0, 2), *run("b", 1, 0.5, 1.5), *run("c", 1, 2, 3), *run("b", 2, 1.5, 4),
               *run("free", 1, 0, 4)]
    return tasks, effects


def test_checker_passes_a_key_at_its_limit() -> None:
    figures, found = check_limits(*history())
    assert not any(found.values()), found
    assert figures["limit_most_at_once"] == 2 and figures["limit_keys_full"] == 1
    assert figures["limited_tasks"] == 3 and figures["limited_executions"] == 4
    assert figures["limit_over"] == 0


def test_checker_finds_a_key_over_its_limit() -> None:
    """The negative check: a third execution of k while two run (and not if it starts as one ends)."""
    tasks, effects = history()
    found = check_limits([*tasks, task("d")], [*effects, *run("d", 1, 1.0, 1.2)])[1]
    assert [k for k, v in found.items() if v] == ["limit exceeded"], found
    [message] = found["limit exceeded"]
    assert message.startswith("k: 3 executions at once") and "d token 1" in message, message
    # A write of a paused owner after its task was taken over would extend its execution: caught too.
    found = check_limits(tasks, [*effects, {"task_key": "c", "token": 1, "worker": "w0:100#step0",
                                            "created_at": at(0.7)}])[1]
    assert found["limit exceeded"], found
    # Each task is judged by the limit it carries: the key's highest.
    found = check_limits([task("a", limit=1), task("b", limit=1), task("c", limit=1)], history()[1])[1]
    assert found["limit exceeded"], found


def test_the_harness_limits_every_other_task() -> None:
    options = [limit_of(n, keys=3, limit=2) for n in range(8)]
    assert options[1] == options[3] == {}
    assert [o["concurrency_key"] for o in options[::2]] == ["chaos-limit-0", "chaos-limit-1", "chaos-limit-2",
                                                            "chaos-limit-0"]
    assert {o["concurrency_limit"] for o in options[::2]} == {2}


def test_start_effects_are_checked_like_steps() -> None:
    """A start effect seen committed is looked for in the final state like a step's."""
    state = {
        "tasks": [{"id": 1, "key": "a", "status": "succeeded", "fencing_token": 1, "attempts": 1}],
        "attempts": [{"id": 1, "task_id": 1, "token": 1, "owner": "w0:100", "started_at": at(0),
                      "ended_at": at(3), "outcome": "succeeded", "stale_writes": 0}],
        "effects": [{"id": n, **e} for n, e in enumerate(run("a", 1, 1, 2), 1)],
    }
    seen = [{"event": "claimed", "key": "a", "token": 1, "owner": "w0:100", "expires": str(at(3))},
            {"event": "step", "step": "start", "key": "a", "token": 1, "owner": "w0:100"},
            {"event": "done", "key": "a", "token": 1, "owner": "w0:100"}]
    assert check(state, seen, ["a"], set()).ok
    state["effects"] = state["effects"][1:]
    verdict = check(state, seen, ["a"], set())
    assert verdict.violations["commit lost"] and "w0:100#start" in verdict.violations["commit lost"][0]


@pytest.mark.slow
def test_short_run_with_limits_never_exceeds_them(tmp_path: Path) -> None:
    """One key limited to 2 under 3 workers x 2 threads, paused and killed: never 3 at once, and
    both places used at some instant."""
    require_binaries()
    code, out, report = chaos(
        tmp_path, "--limits", "--limit-keys", "1", "--limit", "2", "--duration", "5", "--workers", "3",
        "--concurrency", "2", "--faults", "pause,kill", "--fault-interval", "0.7", "--lease", "1",
        "--seed", "5", timeout=240)
    assert code == 0, out
    assert report["ok"] and not report["violations"], out
    figures = report["figures"]
    assert figures["limited_executions"] >= figures["limited_tasks"] > 0, out
    assert figures["limit_most_at_once"] == 2 and figures["limit_over"] == 0, out
    assert figures["effects_accepted"] == figures["tasks_enqueued"], out
    assert report["faults"].get("pause", 0) > 0 and report["faults"].get("kill", 0) > 0, out
