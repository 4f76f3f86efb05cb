"""``claimed_node`` in real LangGraph graphs on the real checkpointer of the database under test.

PostgreSQL run: ``langgraph-checkpoint-postgres`` on the test PostgreSQL server. SQLite run:
LangGraph's SQLite saver on a file. Workers are real OS processes sharing both.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Callable
from functools import partial
from typing import Annotated, Any, TypedDict

import pytest
from asgiref.sync import sync_to_async
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send, interrupt

from devtools.polling import wait_until
from devtools.processes import Child, Supervisor
from django_taskclaim.contrib.langgraph import claimed_node, current_claim, node_identity
from django_taskclaim.exceptions import InvalidResult, TaskBusy, TaskClaimError, TaskFailed
from django_taskclaim.models import Attempt, Task
from tests.conftest import expire
from tests.core.test_async import run
from tests.programs.langgraph_app import acheckpointer, build, build_async, checkpointer
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def until(predicate, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    wait_until(predicate, timeout=timeout, what="the condition")


# -- in one process -------------------------------------------------------------------------

def test_the_node_runs_once_under_a_claim_keyed_by_thread_step_and_node() -> None:
    calls: list[str] = []
    with checkpointer() as saver:
        graph = build(saver, calls=calls, interrupt=False)
        thread = f"t-{uuid.uuid4().hex[:8]}"
        final = graph.invoke({"topic": "POST /payments"}, cfg(thread))
    assert final["published"] == "tests for POST /payments by test"
    assert final["log"] == ["plan", "write", "finish"]
    task = Task.objects.get()
    # thread id : step : node @ version — the same for every worker resuming this checkpoint
    assert task.key == calls[0] == f"{thread}:2:write@v1"
    assert (task.status, task.result) == ("succeeded", {"published": final["published"], "log": ["write"]})
    assert Effect.objects.get().token == task.fencing_token == 1


def test_replay_from_an_earlier_checkpoint_returns_the_stored_update_unless_the_version_changed() -> None:
    calls: list[str] = []
    thread = f"t-{uuid.uuid4().hex[:8]}"
    with checkpointer() as saver:
        first = build(saver, calls=calls, interrupt=False, worker="first")
        final = first.invoke({"topic": "GET /users"}, cfg(thread))
        before_write = next(s for s in first.get_state_history(cfg(thread)) if s.next == ("write",))

        # The same graph replayed from the checkpoint before the node: not run again.
        again = build(saver, calls=calls, interrupt=False, worker="replayer")
        replayed = again.invoke(None, before_write.config)
        assert replayed == final  # the stored update, "by first"
        assert len(calls) == 1 and Effect.objects.count() == 1

        # A new version of the node is a new identity: the replay runs it.
        newer = build(saver, calls=calls, interrupt=False, worker="v2", version="v2")
        rerun = newer.invoke(None, before_write.config)
    assert rerun["published"] == "tests for GET /users by v2"
    assert calls == [f"{thread}:2:write@v1", f"{thread}:2:write@v2"]
    assert sorted(Effect.objects.values_list("worker", flat=True)) == ["first", "v2"]


def test_an_async_graph_on_the_async_checkpointer_replays_like_the_sync_one() -> None:
    calls: list[str] = []
    thread = f"t-{uuid.uuid4().hex[:8]}"

    async def scenario() -> tuple[Any, Any, Any]:
        async with acheckpointer() as saver:
            final = await build_async(saver, calls=calls).ainvoke({"topic": "GET /a"}, cfg(thread))
            before = [s async for s in build_async(saver, calls=calls).aget_state_history(cfg(thread))
                      if s.next == ("write",)][0]
            replayed = await build_async(saver, calls=calls).ainvoke(None, before.config)
            rerun = await build_async(saver, calls=calls, version="v2").ainvoke(None, before.config)
            return final, replayed, rerun

    final, replayed, rerun = run(scenario())
    assert replayed == final and final["published"] == "tests for GET /a (v1)"
    assert rerun["published"] == "tests for GET /a (v2)"
    assert calls == [f"{thread}:2:write@v1", f"{thread}:2:write@v2"]
    assert sorted(Effect.objects.values_list("worker", flat=True)) == ["v1", "v2"]


def test_decorator_forms_key_override_current_claim_and_async_nodes() -> None:
    seen: dict[str, Any] = {}

    @claimed_node
    def bare(state: dict[str, Any]) -> dict[str, Any]:
        seen["bare"] = current_claim().key
        return {"n": state["n"] + 1}

    @claimed_node(key=lambda state, config: f"order-{state['n']}", version="2", on_busy="raise")
    async def keyed(state: dict[str, Any], config: Any) -> dict[str, Any]:
        claim = current_claim()
        seen["keyed"] = (claim.key, config["configurable"]["thread_id"])

        def effect() -> None:
            Effect.objects.create(task_key=claim.key, token=claim.token, worker="async")

        await claim.afenced(effect)
        return {"n": state["n"] * 10}

    assert bare.__name__ == "bare" and keyed.__name__ == "keyed"
    graph = StateGraph(dict)  # type: ignore[type-var]
    graph.add_node("bare", bare)
    graph.add_node("keyed", keyed)
    graph.add_edge(START, "bare")
    graph.add_edge("bare", "keyed")
    graph.add_edge("keyed", END)
    app = graph.compile(checkpointer=InMemorySaver())
    assert run(app.ainvoke({"n": 1}, cfg("t1"))) == {"n": 20}
    assert seen == {"bare": "t1:1:bare", "keyed": ("order-2@2", "t1")}
    assert Effect.objects.get().task_key == "order-2@2"
    with pytest.raises(TaskClaimError, match="only available inside"):
        current_claim()


class FanOut(TypedDict, total=False):
    xs: list[int]
    out: Annotated[list[int], operator.add]


def test_send_fan_out_gives_each_task_of_one_step_its_own_identity() -> None:
    @claimed_node
    def square(state: dict[str, Any]) -> dict[str, Any]:
        return {"out": [state["x"] ** 2]}

    graph = StateGraph(FanOut)
    graph.add_node("square", square)  # type: ignore[arg-type]
    graph.add_conditional_edges(START, lambda s: [Send("square", {"x": x}) for x in s["xs"]])
    graph.add_edge("square", END)
    final = graph.compile(checkpointer=InMemorySaver()).invoke({"xs": [2, 3, 4]}, cfg("fan"))
    assert sorted(final["out"]) == [4, 9, 16]
    assert Task.objects.filter(status="succeeded").count() == 3


def test_a_node_in_a_subgraph_is_placed_by_the_enclosing_task() -> None:
    calls: list[str] = []

    @claimed_node
    def inner(state: dict[str, Any]) -> dict[str, Any]:
        calls.append(current_claim().key)
        return {"out": state.get("out", "") + "x"}

    sub = StateGraph(dict)  # type: ignore[type-var]
    sub.add_node("inner", inner)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)
    graph = StateGraph(dict)  # type: ignore[type-var]
    graph.add_node("a", sub.compile())  # one subgraph used by two nodes: two identities
    graph.add_node("b", sub.compile())
    graph.add_edge(START, "a")
    graph.add_edge("a", "b")
    graph.add_edge("b", END)
    app = graph.compile(checkpointer=InMemorySaver())
    assert app.invoke({"n": 1}, cfg("sub"))["out"] == "xx"
    assert [k.split("%3A")[0] for k in calls] == ["sub:a", "sub:b"]  # thread : enclosing node:task id…
    assert all(k.endswith(":1:inner") for k in calls)
    assert Task.objects.filter(status="succeeded").count() == 2


def test_an_interrupt_gives_the_claim_back_without_spending_an_attempt() -> None:
    @claimed_node
    def ask(state: dict[str, Any]) -> dict[str, Any]:
        return {"answer": interrupt("approve?")}

    graph = StateGraph(dict)  # type: ignore[type-var]
    graph.add_node("ask", ask)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", END)
    app = graph.compile(checkpointer=InMemorySaver())
    app.invoke({"q": 1}, cfg("hitl"))
    task = Task.objects.get()
    assert (task.status, task.attempts) == ("pending", 0)
    from langgraph.types import Command

    assert app.invoke(Command(resume="yes"), cfg("hitl"))["answer"] == "yes"
    assert Task.objects.get().status == "succeeded"


def test_an_update_that_is_not_json_fails_the_step_instead_of_running_it_again() -> None:
    runs: list[int] = []

    @claimed_node
    def bad(state: dict[str, Any]) -> dict[str, Any]:
        runs.append(1)
        return {"when": object()}

    graph = StateGraph(dict)  # type: ignore[type-var]
    graph.add_node("bad", bad)
    graph.add_edge(START, "bad")
    graph.add_edge("bad", END)
    app = graph.compile(checkpointer=InMemorySaver())
    with pytest.raises(InvalidResult, match="JSON"):
        app.invoke({"q": 1}, cfg("bad"))
    assert Task.objects.get().status == "failed"
    with pytest.raises(TaskFailed):  # resuming the failed step does not run the body again
        app.invoke(None, cfg("bad"))
    assert runs == [1]


def test_node_identity_needs_a_thread() -> None:
    with pytest.raises(TaskClaimError, match="thread_id"):
        node_identity({"configurable": {}, "metadata": {"langgraph_step": 1, "langgraph_node": "n"}})
    long = node_identity({"configurable": {"thread_id": "x" * 300},
                          "metadata": {"langgraph_step": 1, "langgraph_node": "n"}})
    assert long.key.startswith("sha256-") and long.key.endswith(":n")
    with pytest.raises(ValueError, match="on_busy"):
        claimed_node(on_busy="later")


def test_on_busy_raise_reports_a_step_held_elsewhere() -> None:
    @claimed_node(on_busy="raise")
    def node(state: dict[str, Any]) -> dict[str, Any]:
        return {"done": True}

    graph = StateGraph(dict)  # type: ignore[type-var]
    graph.add_node("node", node)
    graph.add_edge(START, "node")
    graph.add_edge("node", END)
    app = graph.compile(checkpointer=InMemorySaver())
    Task.objects.claim("busy:1:node", owner="elsewhere")
    with pytest.raises(TaskBusy):
        app.invoke({"q": 1}, cfg("busy"))


def one_node_graph(node: Any) -> Any:
    graph = StateGraph(dict)  # type: ignore[type-var]
    graph.add_node("node", node)
    graph.add_edge(START, "node")
    graph.add_edge("node", END)
    return graph.compile(checkpointer=InMemorySaver())


def taken_over(finish: Any = None) -> None:
    """Inside a node: its lease runs out and another worker takes the step over (and completes
    it with ``finish`` unless that is ``None``)."""
    mine = current_claim()
    expire(mine)
    thief = Task.objects.claim(mine.key, mine.tenant, owner="other worker").claim
    assert thief is not None and thief.token == mine.token + 1
    if finish is not None:
        thief.complete(finish)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_node_fenced_off_mid_run_returns_the_new_owners_update(kind: str) -> None:
    """From the fencing-off on the node is a duplicate: the state update the worker that took the
    step over stored, as every other execution of the step gets (not StaleClaim)."""
    if kind == "sync":
        @claimed_node
        def node(state: dict[str, Any]) -> dict[str, Any]:
            taken_over(finish={"by": "other worker"})
            return {"by": "me"}
    else:
        @claimed_node
        async def node(state: dict[str, Any]) -> dict[str, Any]:
            await sync_to_async(taken_over)(finish={"by": "other worker"})
            return {"by": "me"}

    assert run(one_node_graph(node).ainvoke({"q": 1}, cfg("fenced"))) == {"by": "other worker"}
    task = Task.objects.get()
    assert (task.owner, task.result) == ("other worker", {"by": "other worker"})
    assert Attempt.objects.get(task=task, token=1).stale_writes == 1


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_node_fenced_off_while_the_new_owner_runs_answers_by_on_busy(kind: str) -> None:
    if kind == "sync":
        @claimed_node(on_busy="raise")
        def node(state: dict[str, Any]) -> dict[str, Any]:
            taken_over()
            return {"by": "me"}
    else:
        @claimed_node(on_busy="raise")
        async def node(state: dict[str, Any]) -> dict[str, Any]:
            await sync_to_async(taken_over)()
            return {"by": "me"}

    with pytest.raises(TaskBusy):
        run(one_node_graph(node).ainvoke({"q": 1}, cfg("busy")))
    assert Task.objects.get().owner == "other worker"


# -- worker processes sharing the database and the checkpointer ------------------------------

@pytest.fixture
def workers(processes: Supervisor) -> Callable[..., Child]:
    """Start ``python -m tests.programs.langgraph_worker ARGS`` children of ``processes``."""
    return partial(processes.start, "tests.programs.langgraph_worker")


def interrupted_thread() -> str:
    """A thread run up to the interrupt before the claimed node, as a user's first request would."""
    thread = f"t-{uuid.uuid4().hex[:8]}"
    with checkpointer() as saver:
        graph = build(saver)
        graph.invoke({"topic": "POST /payments"}, cfg(thread))
        assert graph.get_state(cfg(thread)).next == ("write",)
    return thread


@pytest.mark.slow
def test_two_processes_resume_one_interrupted_thread_and_the_effect_lands_once(processes, workers) -> None:  # type: ignore[no-untyped-def]
    thread = interrupted_thread()
    a, b = workers(thread, "--block"), workers(thread, "--block")
    processes.go(a, b)
    # One of them enters the node; the other must find the step running and wait for it.
    winner, _ = processes.wait_for(lambda proc, e: e["event"] != "ready", timeout=60, what="a worker in the node")
    loser = b if winner is a else a
    entered = winner.event(timeout=60)
    assert entered["event"] == "in-node" and entered["key"] == f"{thread}:2:write@v1"
    until(lambda: Attempt.objects.filter(outcome="duplicate").exists())
    winner.send("go")  # let the body finish
    finals = [winner.event(timeout=60), loser.event(timeout=60)]
    for proc in (a, b):
        assert proc.wait(60) == 0, proc.stderr()
    assert [f["event"] for f in finals] == ["final", "final"]
    assert finals[0]["state"] == finals[1]["state"]  # the loser returned the stored update
    assert finals[0]["state"]["published"] == f"tests for POST /payments by {finals[0]['worker']}"
    assert Effect.objects.count() == 1
    assert Task.objects.get(key=entered["key"]).status == "succeeded"
    with checkpointer() as saver:  # both appended a final checkpoint to the thread: the same state
        assert build(saver).get_state(cfg(thread)).values == finals[0]["state"]


@pytest.mark.slow
def test_a_worker_killed_inside_the_node_is_taken_over_after_its_lease(processes, workers) -> None:  # type: ignore[no-untyped-def]
    thread = interrupted_thread()
    first = workers(thread, "--block", "--lease", "1")
    processes.go(first)
    entered = first.event(timeout=60)
    assert entered["event"] == "in-node"
    first.kill()
    first.wait(30)

    second = workers(thread, "--lease", "1")
    processes.go(second)
    took_over = second.event(timeout=60)
    assert took_over["event"] == "in-node" and took_over["token"] == entered["token"] + 1
    final = second.finish(60)
    assert final["state"]["log"] == ["plan", "write", "finish"]

    # A third resume of the same checkpoint finds the step done: stored update, no effect.
    third = workers(thread)
    processes.go(third)
    assert third.event(timeout=60) == {"event": "final", "state": final["state"], "worker": event_worker(third)}
    effect = Effect.objects.get()
    assert (effect.worker, effect.token) == (final["worker"], 2)
    assert Attempt.objects.filter(outcome="taken_over").count() == 1


def event_worker(proc: Child) -> str:
    return f"worker-{proc.pid}"
