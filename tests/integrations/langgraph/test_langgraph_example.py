"""The example project's LangGraph agent (example_project/testgen/graph.py): the graph, run for real."""

from __future__ import annotations

from typing import Any

import pytest

from django_taskclaim.exceptions import TaskBusy
from django_taskclaim.models import Task
from tests.integrations.test_example import example_app  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)

PAYLOAD = {"service": "payments", "endpoint": "POST /payments", "spec_version": "v3", "framework": "pytest"}


def agent(name: str, events: list[dict[str, Any]]) -> Any:
    from example_project.testgen.graph import build_graph

    return build_graph(name, lambda event, **fields: events.append({"event": event, **fields}))


def test_the_graph_agent_publishes_once_and_a_duplicate_gets_the_stored_update(example_app) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from example_project.testgen.jobs import JobSpec

    TestSuite = example_app
    job = {"tenant": "acme", "run": "run-42", "payload": PAYLOAD}
    key = JobSpec.from_payload("acme", "run-42", PAYLOAD).task_key
    first_events: list[dict[str, Any]] = []
    first = agent("agent-2", first_events).invoke(job)
    assert first["summary"] == "2 tests by agent-2 (token 1)"
    assert [e["event"] for e in first_events] == ["claimed", "progress", "progress", "published"]

    # A redelivery to another agent: the graph runs, the claimed node's body does not.
    again_events: list[dict[str, Any]] = []
    again = agent("agent-4", again_events).invoke(job)
    assert again == first and again_events == []
    assert list(TestSuite.objects.values_list("agent", "token")) == [("agent-2", 1)]
    task = Task.objects.get(key=key.key, tenant="acme")
    assert (task.status, task.owner) == ("succeeded", "agent-2")
    assert task.result == {"tests": 2, "agent": "agent-2", "token": 1}

    # While another agent holds a job, the node refuses (on_busy="raise"): the queue retries later.
    other = {**job, "run": "run-43"}
    Task.objects.claim(JobSpec.from_payload("acme", "run-43", PAYLOAD).task_key, owner="agent-1")
    with pytest.raises(TaskBusy, match="agent-1"):
        agent("agent-3", []).invoke(other)
