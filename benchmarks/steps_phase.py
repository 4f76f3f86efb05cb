"""The durable steps phase (issue 43, part 5): what a step that was already stored costs.

In this process, on the benchmark's database: a task whose first claim stored ``STEPS`` steps
(``claim.step``) is taken over, and the new claim asks for every step again. Counted with Django's
``CaptureQueriesContext``: the statements of its first stored step (the one read of every stored
step, which also checks the claim) and of the others (none). Timed, each round: a stored step once
read against a plain dict lookup of the same value (the step decodes its stored JSON on every call,
so that no caller shares a mutable result with another), the first stored step of a claim (its one
round trip; the claim's record of the read dropped before each) against ``claim.check()`` (one round
trip), and a new step (its guarded insert) against ``claim.check()``.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

from .workers import LEASE

STEPS = 20
LOOKUPS = 20_000


def _per_call(fn: Callable[[], Any], n: int) -> float:
    """Seconds per call of ``fn``, the best of three runs of ``n`` calls."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best


def _called(name: str) -> Callable[[], Any]:
    def fail() -> Any:
        raise AssertionError(f"stored step {name} was called again")
    return fail


def one_round(n: int) -> dict[str, float]:
    """One round on a fresh task: statement counts and seconds per operation."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_taskclaim.models import Task

    key = f"bench-steps-{n}"
    first = Task.objects.claim(key, owner="bench-a", lease=LEASE).claim
    assert first is not None
    for i in range(STEPS):
        first.step(f"s{i}", lambda i=i: {"call": i, "text": "x" * 200})
    Task.objects.filter(pk=first.task_id).update(lease_expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    claim = Task.objects.claim(key, owner="bench-b", lease=LEASE).claim
    assert claim is not None and claim.token == first.token + 1
    with CaptureQueriesContext(connection) as read:
        started = time.perf_counter()
        claim.step("s0", _called("s0"))
        first_stored = time.perf_counter() - started
    with CaptureQueriesContext(connection) as rest:
        for i in range(1, STEPS):
            claim.step(f"s{i}", _called(f"s{i}"))
    stored = _per_call(lambda: claim.step("s1", _called("s1")), LOOKUPS)

    def first_again() -> None:
        claim._steps = None  # as a new claim: its first step reads the task's stored steps
        claim.step("s0", _called("s0"))

    first_read = _per_call(first_again, 50)
    table = {f"s{i}": {"call": i, "text": "x" * 200} for i in range(STEPS)}
    lookup = _per_call(lambda: table["s1"], LOOKUPS)
    check = _per_call(claim.check, 50)
    count = iter(range(10**9))
    new = _per_call(lambda: claim.step(f"new-{next(count)}", lambda: {"call": "new"}), 50)
    claim.complete()
    return {"first_statements": len(read.captured_queries), "rest_statements": len(rest.captured_queries),
            "first_ms": first_read * 1e3, "cold_ms": first_stored * 1e3, "check_ms": check * 1e3, "new_ms": new * 1e3,
            "stored_us": stored * 1e6, "lookup_us": lookup * 1e6}


def run(bench: Any, log: Callable[[str], None]) -> None:
    from django.db import connections

    rounds: list[dict[str, float]] = []
    for n in range(bench.sizes.rounds):
        bench.clear()
        rounds.append(one_round(n))
        connections.close_all()
        r = rounds[-1]
        log(f"  steps round {n + 1}/{bench.sizes.rounds}: first stored step {r['first_statements']} statement(s), "
            f"the other {STEPS - 1}: {r['rest_statements']}; a stored step {r['stored_us']:.2f} µs "
            f"(dict lookup {r['lookup_us']:.3f} µs)")
    bench.results.steps = {"rounds": rounds, "steps": STEPS}


def worst_statements(r: dict[str, Any]) -> float:
    """The most statements a stored step cost in any round: the first of a claim's, or the others' average."""
    return max(max(x["first_statements"], x["rest_statements"] / max(1, r["steps"] - 1)) for x in r["rounds"])


def targets(r: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """The phase's row of the report's targets: a stored step costs at most one statement."""
    if not r:
        return []
    worst = worst_statements(r)
    return [("statements per stored step (the first a claim asks for reads them all; the others none)",
             f"{worst:g}", "≤ 1", worst <= 1)]


def markdown(r: dict[str, Any]) -> list[str]:
    """The report's section (empty when the phase did not run)."""
    if not r:
        return []
    rounds = r["rounds"]

    def span(name: str, fmt: str) -> str:
        values = [x[name] for x in rounds]
        return f"{min(values):{fmt}}–{max(values):{fmt}}" if len(values) > 1 else f"{values[0]:{fmt}}"

    def ratio(a: str, b: str) -> str:
        values = [x[a] / x[b] for x in rounds if x[b]]
        return f"{min(values):.2f}–{max(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"

    worst = worst_statements(r)
    return [
        "## Durable steps (statements, ms)",
        "",
        f"A task whose first claim stored {r['steps']} steps (`claim.step`) is taken over; the new claim asks "
        "for each step again (none is called). Statements counted with Django's `CaptureQueriesContext`; "
        "times in this process, each round (min–max over the rounds).",
        "",
        "| measure | value | ratio |",
        "|---|---:|---:|",
        f"| statements of the first stored step (reads every stored step, checks the claim) "
        f"| {span('first_statements', 'd')} | |",
        f"| statements of the other {r['steps'] - 1} stored steps, in all | {span('rest_statements', 'd')} | |",
        f"| first stored step of a claim (the read of all {r['steps']}), ms / `claim.check()`, ms "
        f"| {span('first_ms', '.3f')} / {span('check_ms', '.3f')} | {ratio('first_ms', 'check_ms')} |",
        f"| the very first, on the session's first use of the statement, ms | {span('cold_ms', '.3f')} | |",
        f"| a stored step once read, µs / a dict lookup, µs | {span('stored_us', '.2f')} / {span('lookup_us', '.3f')} "
        f"| {ratio('stored_us', 'lookup_us')} |",
        f"| a new step (its guarded insert), ms / `claim.check()`, ms | {span('new_ms', '.3f')} / "
        f"{span('check_ms', '.3f')} | {ratio('new_ms', 'check_ms')} |",
        "",
        f"A stored step costs at most {worst:g} statement (target: ≤ 1): "
        + ("met." if worst <= 1 else "NOT MET."),
        "",
    ]
