"""The LangGraph agent: the same job as :mod:`example_project.agent`, run as a real LangGraph graph.

    plan ──▶ generate (a claimed_node: one agent at a time, its effect once) ──▶ report

``generate`` is wrapped by :func:`django_taskclaim.contrib.langgraph.claimed_node` with the
job's own identity (``key=``), so an agent that receives a duplicate delivery runs the graph
but not the node's body: it gets ``TaskBusy`` while another agent holds the job, or the stored
state update once the job is done. Inside the body ``current_claim()`` is the job's claim:
the suite is generated under its keepalive and published through ``fenced()``.
No model, no network: generation is the same simulated work as the plain agent's.
"""

from __future__ import annotations

import argparse
from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from django_taskclaim import TaskKey
from django_taskclaim.contrib.langgraph import claimed_node, current_claim
from django_taskclaim.exceptions import StaleClaim

from .testgen.jobs import JobSpec
from .testgen.work import discard, generate_suite, publish


class JobState(TypedDict, total=False):
    tenant: str
    run: str
    payload: dict[str, Any]
    endpoint: str  # set by plan
    tests: int  # the update of generate (stored as the job's result): tests, agent, token
    agent: str
    token: int
    summary: str  # set by report


def build_graph(args: argparse.Namespace, emit: Any) -> Any:
    """The agent's graph; ``emit`` reports progress events to the demo's driver."""

    def spec_of(state: JobState) -> JobSpec:
        return JobSpec.from_payload(state["tenant"], state["run"], state["payload"])

    def job_key(state: JobState, config: RunnableConfig) -> TaskKey:
        return spec_of(state).task_key  # the job's identity, whichever delivery runs the graph

    def plan(state: JobState) -> JobState:
        return {"endpoint": spec_of(state).endpoint}

    @claimed_node(key=job_key, lease=args.lease, on_busy="raise", owner=args.name)
    def generate(state: JobState) -> JobState:
        claim, spec = current_claim(), spec_of(state)
        emit(event="claimed", token=claim.token)
        rel = ""
        try:
            rel, tests = generate_suite(
                claim, spec, args.name, work_seconds=args.work_seconds, steps=args.steps,
                on_step=lambda step: emit(event="progress", step=step, of=args.steps),
            )
            publish(claim, spec, args.name, rel, tests)  # fenced: suite row + completion, or nothing
        except StaleClaim:
            if rel:
                discard(rel)
            raise
        return {"tests": tests, "agent": args.name, "token": claim.token}  # = the stored result

    def report(state: JobState) -> JobState:
        return {"summary": f"{state['tests']} tests by {state['agent']} (token {state['token']})"}

    graph = StateGraph(JobState)
    graph.add_node("plan", plan)
    graph.add_node("generate", generate)
    graph.add_node("report", report)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "generate")
    graph.add_edge("generate", "report")
    graph.add_edge("report", END)
    return graph.compile()
