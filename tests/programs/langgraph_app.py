"""A small deterministic LangGraph graph for the tests (no model calls) and its checkpointer.

plan -> write (a ``claimed_node`` whose effect is an ``Effect`` row) -> finish. The checkpointer
is LangGraph's PostgreSQL saver on the test PostgreSQL database, or its SQLite saver on a file
next to the SQLite test database: both are shared by every process of a test.
"""

from __future__ import annotations

import operator
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Annotated, Any, TypedDict

from django.db import connection
from langgraph.graph import END, START, StateGraph

from devtools.events import emit
from django_taskclaim.contrib.langgraph import claimed_node, current_claim


class State(TypedDict, total=False):
    topic: str
    draft: str
    published: str
    log: Annotated[list[str], operator.add]


def build(checkpointer: Any, *, version: str = "v1", lease: float = 30, worker: str = "test",
          block: bool = False, interrupt: bool = True, calls: list[str] | None = None) -> Any:
    """The graph; ``block`` makes the claimed node wait for a line on stdin (a process test's pause)."""
    from tests.testapp.models import Effect

    def plan(state: State) -> State:
        return {"draft": f"tests for {state['topic']}", "log": ["plan"]}

    @claimed_node(version=version, lease=lease)
    def write(state: State) -> State:
        claim = current_claim()
        if calls is not None:
            calls.append(claim.key)
        emit(event="in-node", key=claim.key, token=claim.token, pid=os.getpid())
        if block:
            sys.stdin.readline()  # held here until the test says go on (or kills us)
        update: State = {"published": f"{state['draft']} by {worker}", "log": ["write"]}
        with claim.fenced():  # the effect and the stored update commit together, or not at all
            Effect.objects.create(task_key=claim.key, token=claim.token, worker=worker)
            claim.complete(update)
        return update

    return _plan_write_finish(plan, write, checkpointer, interrupt_before=["write"] if interrupt else None)


def build_async(checkpointer: Any, *, version: str = "v1", calls: list[str]) -> Any:
    """plan -> write (an async claimed node, its effect through afenced) -> finish; no interrupt."""
    from tests.testapp.models import Effect

    def plan(state: State) -> State:
        return {"draft": f"tests for {state['topic']}", "log": ["plan"]}

    @claimed_node(version=version)
    async def write(state: State) -> State:
        claim = current_claim()
        calls.append(claim.key)
        update: State = {"published": f"{state['draft']} ({version})", "log": ["write"]}

        def publish() -> None:
            Effect.objects.create(task_key=claim.key, token=claim.token, worker=version)
            claim.complete(update)

        await claim.afenced(publish)
        return update

    return _plan_write_finish(plan, write, checkpointer)


def _plan_write_finish(plan: Any, write: Any, checkpointer: Any, interrupt_before: list[str] | None = None) -> Any:
    """The graph both builders compile: plan -> write -> finish."""

    def finish(state: State) -> State:
        return {"log": ["finish"]}

    graph = StateGraph(State)
    graph.add_node("plan", plan)
    graph.add_node("write", write)
    graph.add_node("finish", finish)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "write")
    graph.add_edge("write", "finish")
    graph.add_edge("finish", END)
    return graph.compile(checkpointer=checkpointer, interrupt_before=interrupt_before)


def _conninfo() -> str:
    from psycopg.conninfo import make_conninfo

    settings = connection.settings_dict
    return make_conninfo(host=settings["HOST"], port=settings["PORT"], user=settings["USER"],
                         dbname=settings["NAME"], password=settings["PASSWORD"] or None)


def _sqlite_checkpoints() -> str:
    """The SqliteSaver file beside the SQLite test database; elsewhere (MariaDB, which LangGraph
    has no saver for) in the temporary folder, named after the test database."""
    name = str(connection.settings_dict["NAME"])
    if connection.vendor == "sqlite":
        return name + ".langgraph"
    return os.path.join(tempfile.gettempdir(), f"taskclaim-{os.getuid()}-{name}.langgraph")


@asynccontextmanager
async def acheckpointer() -> AsyncIterator[Any]:
    """The async flavour of :func:`checkpointer` (AsyncPostgresSaver / AsyncSqliteSaver)."""
    if connection.vendor == "postgresql":
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        async with AsyncPostgresSaver.from_conn_string(_conninfo()) as saver:
            await saver.setup()
            yield saver
    else:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with AsyncSqliteSaver.from_conn_string(_sqlite_checkpoints()) as saver:
            await saver.setup()
            yield saver


@contextmanager
def checkpointer() -> Iterator[Any]:
    """The real checkpointer for the database under test, its tables created."""
    if connection.vendor == "postgresql":
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(_conninfo()) as saver:
            saver.setup()
            yield saver
    else:
        from langgraph.checkpoint.sqlite import SqliteSaver

        with SqliteSaver.from_conn_string(_sqlite_checkpoints()) as saver:
            saver.setup()
            yield saver
