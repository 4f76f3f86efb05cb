"""The agent as a LangGraph graph: ``plan ──▶ generate ──▶ summarize``, run for real.

``generate`` is a :func:`~django_taskclaim.contrib.langgraph.claimed_node` keyed by the job
(``key=``), so a graph run for a duplicate delivery does not run the node's body: it gets
``TaskBusy`` while another agent holds the job, or the stored state update once it is done.
Inside the body ``current_claim()`` is the job's claim, kept alive by the node; the body is the
same work and fenced publish as the plain agent's. No model, no network.
"""

from __future__ import annotations

from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from django_taskclaim import TaskKey
from django_taskclaim.contrib.langgraph import claimed_node, current_claim
from django_taskclaim.exceptions import StaleClaim

from .agent import Report, generate_and_publish, ignore
from .jobs import JobSpec


class JobState(TypedDict, total=False):
    tenant: str
    run: str
    payload: dict[str, Any]
    endpoint: str  # set by plan
    tests: int  # tests, agent and token: the update of generate, stored as the job's result
    agent: str
    token: int
    summary: str  # set by summarize


def spec_of(state: JobState) -> JobSpec:
    return JobSpec.from_payload(state["tenant"], state["run"], state["payload"])


def job_key(state: JobState, config: RunnableConfig) -> TaskKey:
    return spec_of(state).task_key  # the job's identity, whichever delivery runs the graph


def plan(state: JobState) -> JobState:
    return {"endpoint": spec_of(state).endpoint}


def summarize(state: JobState) -> JobState:
    return {"summary": f"{state['tests']} tests by {state['agent']} (token {state['token']})"}


def build_graph(owner: str, report: Report = ignore) -> Any:
    """The agent ``owner``'s graph; ``report`` hears what its claimed node does."""

    @claimed_node(key=job_key, on_busy="raise", owner=owner)  # the lease: TASKCLAIM_DEFAULT_LEASE
    def generate(state: JobState) -> dict[str, Any]:  # the update: tests, agent, token
        claim = current_claim()
        try:
            return generate_and_publish(claim, spec_of(state), owner, report)
        except StaleClaim as exc:  # taken over: the draft is thrown away, and the node answers
            report("fenced", token=claim.token, action=exc.action)  # as a duplicate from here on
            raise

    graph = StateGraph(JobState)
    graph.add_node("plan", plan)
    graph.add_node("generate", generate)
    graph.add_node("summarize", summarize)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "generate")
    graph.add_edge("generate", "summarize")
    graph.add_edge("summarize", END)
    return graph.compile()
