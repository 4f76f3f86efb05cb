"""The per-task options of the integrations that claim by key are honoured, as the claim and the
task row see them: ``@claimed_task(lease=, max_attempts=, tenant=)`` of the Celery bridge (called
directly: no broker) and ``claimed_node(lease=, owner=)`` of LangGraph, sync and async nodes
(issue 30, item 14: an option dropped on its way to the claim failed no test)."""

from __future__ import annotations

import os
import uuid
from typing import Any, TypedDict

import pytest
from django.test import override_settings

from django_taskclaim.models import Task

pytestmark = pytest.mark.django_db(transaction=True)

try:
    import celery  # noqa: F401
    import langgraph  # noqa: F401
except ImportError:  # in CI a missing extra is a failure, not a skip
    if os.environ.get("CI"):
        raise
    pytest.skip("celery or langgraph is not installed", allow_module_level=True)

from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

from django_taskclaim.celery import claimed_task  # noqa: E402
from django_taskclaim.contrib.langgraph import claimed_node, current_claim  # noqa: E402
from tests.core.test_async import run  # noqa: E402
from tests.programs.celery_app import app  # noqa: E402, F401  (the Celery app the shared tasks join)


def held() -> dict[str, Any]:
    """What the running claim holds: its lease (by the claim, and as the task row counts it),
    owner, tenant and the row's max_attempts."""
    claim = current_claim()
    row = Task.objects.using(claim.using).get(pk=claim.task_id)
    return {"lease": claim.lease, "row_lease": (row.lease_expires_at - row.updated_at).total_seconds(),
            "owner": claim.owner, "tenant": claim.tenant, "max_attempts": row.max_attempts}


# A lease shorter than any other claimed Celery task's (tests.programs.celery_tasks.always_fails
# has 5 s): the broker checks (W104) name the task with the longest lease, and every claimed task
# of the test run is registered with the project's app.
@claimed_task(key="opts-{0}", tenant="acme", lease=4, max_attempts=3)
def celery_with_options(name: str) -> dict[str, Any]:
    return held()


@claimed_task(key="plain-{0}")
def celery_plain(name: str) -> dict[str, Any]:
    return held()


def test_a_celery_tasks_lease_max_attempts_and_tenant_reach_its_claim() -> None:
    got = celery_with_options("a")
    assert (got["lease"], got["tenant"], got["max_attempts"]) == (4, "acme", 3)
    assert 3 < got["row_lease"] <= 4  # not the default lease (30 s): the task's own
    assert Task.objects.get(key="opts-a").tenant == "acme"


def test_a_celery_task_without_options_takes_the_settings() -> None:
    with override_settings(TASKCLAIM_DEFAULT_LEASE=55, TASKCLAIM_MAX_ATTEMPTS=6):
        got = celery_plain("b")
    assert (got["lease"], got["tenant"], got["max_attempts"]) == (55, "", 6)


class State(TypedDict):
    got: dict[str, Any]


def graph_of(node: Any) -> Any:
    builder = StateGraph(State)
    builder.add_node("report", node)
    builder.add_edge(START, "report")
    builder.add_edge("report", END)
    return builder.compile(checkpointer=InMemorySaver())


@claimed_node(lease=77, owner="node-owner")
def sync_report(state: State) -> dict[str, Any]:
    return {"got": held()}


@claimed_node(lease=88, owner="async-owner")
async def async_report(state: State) -> dict[str, Any]:
    from asgiref.sync import sync_to_async

    return {"got": await sync_to_async(held)()}


@claimed_node
def default_report(state: State) -> dict[str, Any]:
    return {"got": held()}


def config() -> dict[str, Any]:
    return {"configurable": {"thread_id": f"t-{uuid.uuid4().hex[:8]}"}}


def test_a_langgraph_nodes_lease_and_owner_reach_its_claim() -> None:
    got = graph_of(sync_report).invoke({"got": {}}, config())["got"]
    assert (got["lease"], got["owner"]) == (77, "node-owner") and 72 < got["row_lease"] <= 77
    got = run(graph_of(async_report).ainvoke({"got": {}}, config()))["got"]
    assert (got["lease"], got["owner"]) == (88, "async-owner") and 83 < got["row_lease"] <= 88
    with override_settings(TASKCLAIM_DEFAULT_LEASE=55):
        got = graph_of(default_report).invoke({"got": {}}, config())["got"]
    assert got["lease"] == 55 and got["owner"] != "node-owner"
