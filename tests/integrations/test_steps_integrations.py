"""Durable steps in each integration that runs a body under a claim: Django tasks (sync and async),
handler workers (plain and ``atomic``), LangGraph nodes (run_once: tests/core/test_steps.py; the
Celery bridge with a real worker: tests/integrations/celery/test_celery.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from django_taskclaim.contrib.langgraph import claimed_node, current_claim
from django_taskclaim.models import Step, Task
from django_taskclaim.tasks.compat import TaskResultStatus
from django_taskclaim.tasks.runner import TaskRunner
from django_taskclaim.worker import work
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def calls() -> Counter[str]:
    return Counter(Effect.objects.values_list("task_key", flat=True))


@pytest.mark.parametrize("task", ["stepped", "astepped"])
def test_a_django_tasks_retry_gets_its_stored_steps(task: str) -> None:
    result = getattr(tasks, task).enqueue(fail_until=2)
    work(TaskRunner("default"), owner="tester", queue="default", until_drained=True, poll=0.02)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 3
    assert result.return_value == [f"{task}:first".upper(), f"{task}:second".upper()]
    assert calls() == {f"{task}:first": 1, f"{task}:second": 1}  # the first step ran on attempt 1 only
    assert sorted(Step.objects.values_list("name", "token")) == [("first", 1), ("second", 3)]


def test_a_handler_workers_steps_and_an_atomic_handlers_steps_roll_back_with_its_failure() -> None:
    Task.objects.ensure("plain", queue="default", max_attempts=3)
    Task.objects.ensure("atomic", queue="other", max_attempts=3)
    failures = Counter[str]()

    def handler(claim: Any) -> str:
        first = claim.step("first", lambda: Effect.objects.create(task_key=f"{claim.key}:first", token=claim.token,
                                                                    worker="").pk and "one")
        if failures[claim.key] < 1:
            failures[claim.key] += 1
            raise RuntimeError("fails once after its first step")
        return first + claim.step("second", lambda: "two")

    work(handler, owner="w", queue="default", until_drained=True, poll=0.01)
    work(handler, owner="w", queue="other", until_drained=True, poll=0.01, atomic=True)
    assert dict(Task.objects.values_list("key", "result")) == {"plain": "onetwo", "atomic": "onetwo"}
    # A plain handler's step committed on its own: not called again. An atomic handler's step was in
    # its fenced() block, rolled back with the failure, with the effect it made: run again, once.
    assert Effect.objects.filter(task_key="plain:first").count() == 1
    assert list(Effect.objects.filter(task_key="atomic:first").values_list("token", flat=True)) == [2]
    assert sorted(Step.objects.filter(task__key="atomic").values_list("name", "token")) == [
        ("first", 2), ("second", 2)]


def test_a_langgraph_node_resumed_after_an_interrupt_does_not_repeat_its_model_call() -> None:
    model_calls: list[str] = []

    @claimed_node
    def draft(state: dict[str, Any]) -> dict[str, Any]:
        claim = current_claim()
        text = claim.step("model", lambda: model_calls.append(state["topic"]) or f"draft of {state['topic']}")
        approved = interrupt(f"approve {text!r}?")  # the node runs again from the top when resumed
        return {"draft": text, "approved": approved}

    graph = StateGraph(dict)  # type: ignore[type-var]
    graph.add_node("draft", draft)
    graph.add_edge(START, "draft")
    graph.add_edge("draft", END)
    app = graph.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "steps"}}
    app.invoke({"topic": "payments"}, config)
    assert Task.objects.get().status == "pending"  # the interrupt gave the claim back
    final = app.invoke(Command(resume="yes"), config)
    assert (final["draft"], final["approved"]) == ("draft of payments", "yes")
    assert model_calls == ["payments"]
    assert list(Step.objects.values_list("name", "token")) == [("model", 1)]
