"""LangGraph nodes that run once per graph step, whichever worker resumes the thread.

    from django_taskclaim.contrib.langgraph import claimed_node, current_claim

    @claimed_node(version="v1")
    def publish(state: State) -> dict:
        with current_claim().fenced() as claim:      # the effect commits only if we still own it
            Report.objects.create(run=state["run"], body=state["draft"])
            claim.complete({"published": True})       # ...and together with the stored update
        return {"published": True}

A node's identity is its place in the run: the thread id, the checkpoint namespace, the step
and the node name (plus ``version``). Every worker that resumes the same checkpoint computes
the same identity, so two workers resuming one thread at once, a retried run, or a replay
from an earlier checkpoint race for one claim: one runs the body, the others return the
body's stored state update (``on_busy="wait"``), and both runs reach the same final state.
A new ``version`` is a new identity: replaying with it runs the node again.

The state update a node returns is stored as JSON (``Claim.complete``), so it must be
JSON-serialisable: dicts, lists, strings, numbers, booleans and ``None`` (tuples come back as
lists). Return plain data, not LangChain message objects, ``Command``\\ s or ``Send``\\ s.

Requires the ``langgraph`` extra: ``pip install django-taskclaim[langgraph]``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar, overload

from asgiref.sync import sync_to_async
from django.db import connections
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphBubbleUp

from .. import routing
from ..claims import Claim, claim
from ..exceptions import InvalidTaskKey, TaskClaimError
from ..execution import (
    Policy,
    aexecute,
    arun_by_key,
    check_on_busy,
    current_claim,
    execute,
    run_by_key,
)
from ..identity import MAX_KEY_LENGTH, TaskKey, validate_key
from ..values import lease_seconds

__all__ = ["claimed_node", "current_claim", "node_identity"]

logger = logging.getLogger("django_taskclaim")

F = TypeVar("F", bound=Callable[..., Any])
KeyFunc = Callable[[Any, RunnableConfig], "str | TaskKey"]

# LangGraph's names (langgraph/_internal/_constants.py and pregel/_algo.py): the thread in
# ``configurable``, the task's place in ``metadata``.
THREAD_ID = "thread_id"
STEP, NODE, PATH, CHECKPOINT_NS = "langgraph_step", "langgraph_node", "langgraph_path", "langgraph_checkpoint_ns"
PUSH, NS_SEP = "__pregel_push", "|"
CHECKPOINTER, CHECKPOINT_MAP = "__pregel_checkpointer", "checkpoint_map"

# interrupt() (or a Command to the parent graph): the node runs again on resume, so giving the
# claim back does not spend an attempt. A failure is recorded, PENDING while attempts remain.
POLICY = Policy(release_on=(GraphBubbleUp,))


def node_identity(config: RunnableConfig, version: str = "", *, forks: int = 0) -> TaskKey:
    """The default identity of the node running under ``config``.

    ``TaskKey(node, run=thread_id, scope=(parent namespace…, step[, send index]), version=…)``,
    e.g. ``thread-7:2:publish@v1``. The task id LangGraph appends to the namespace is left
    out (it changes with the checkpoint id), and ``forks`` — the time-travel forks in the
    checkpoint's lineage, each of which LangGraph counts as one more step — is taken off the
    step, so a replay from an earlier checkpoint finds the identity of the original run.
    """
    configurable = config.get("configurable") or {}
    metadata = config.get("metadata") or {}
    thread_id = configurable.get(THREAD_ID)
    node, step = metadata.get(NODE), metadata.get(STEP)
    if thread_id in (None, "") or node is None or step is None:
        raise TaskClaimError(
            "claimed_node needs a LangGraph run with a thread: compile the graph with a checkpointer "
            "and pass config={'configurable': {'thread_id': ...}}, or give claimed_node a key= callable"
        )
    scope: list[str | int] = [parent] if (parent := _parent_ns(config)) else []
    scope.append(int(step) - forks)
    path: tuple[Any, ...] = tuple(metadata.get(PATH) or ())
    if len(path) >= 2 and path[0] == PUSH:  # Send() fan-out: many tasks of one node in one step
        scope.append(f"send-{path[1]}")
    try:
        return TaskKey(str(node), run=str(thread_id), scope=tuple(scope), version=version or None)
    except InvalidTaskKey:
        # Deep subgraph namespaces and long thread ids can pass the key's 255 characters:
        # the same parts, digested, are the same identity for every worker.
        digest = hashlib.sha256("\x00".join(map(str, [thread_id, *scope])).encode()).hexdigest()
        return TaskKey(str(node), run=f"sha256-{digest}", version=version or None)


def _parent_ns(config: RunnableConfig) -> str:
    # "outer:<task id>|node:<task id>": the enclosing graphs' segments locate a subgraph; this
    # task's own segment is dropped (node name and step are parts of their own).
    metadata, configurable = config.get("metadata") or {}, config.get("configurable") or {}
    ns = str(metadata.get(CHECKPOINT_NS) or configurable.get("checkpoint_ns") or "")
    return ns.rsplit(NS_SEP, 1)[0] if NS_SEP in ns else ""


def _lineage(config: RunnableConfig) -> tuple[Any, dict[str, Any], dict[str, Any]] | None:
    """The run's checkpointer, a filter for its thread's forks, and the task's own checkpoint."""
    configurable = config.get("configurable") or {}
    saver = configurable.get(CHECKPOINTER)
    ns = _parent_ns(config)
    checkpoint_id = (configurable.get(CHECKPOINT_MAP) or {}).get(ns)
    if saver is None or checkpoint_id is None:
        return None
    thread = {"configurable": {"thread_id": configurable[THREAD_ID], "checkpoint_ns": ns}}
    start = {"configurable": {**thread["configurable"], "checkpoint_id": checkpoint_id}}
    return saver, thread, start


def count_forks(config: RunnableConfig) -> int:
    """Time-travel forks between the root of the thread and the checkpoint this task runs from.

    One query when the thread has no fork (the common case); otherwise a walk up the lineage.
    """
    found = _lineage(config)
    if found is None:
        return 0
    saver, thread, start = found
    if next(iter(saver.list(thread, filter={"source": "fork"}, limit=1)), None) is None:
        return 0
    forks, at = 0, start
    while at is not None and (item := saver.get_tuple(at)) is not None:
        forks += item.metadata.get("source") == "fork"
        at = item.parent_config
    return forks


async def acount_forks(config: RunnableConfig) -> int:
    """:func:`count_forks` through an async checkpointer's ``alist``/``aget_tuple``."""
    found = _lineage(config)
    if found is None:
        return 0
    saver, thread, start = found
    async for _ in saver.alist(thread, filter={"source": "fork"}, limit=1):
        break
    else:
        return 0
    forks, at = 0, start
    while at is not None and (item := await saver.aget_tuple(at)) is not None:
        forks += item.metadata.get("source") == "fork"
        at = item.parent_config
    return forks


def _versioned(key: str | TaskKey, version: str) -> str | TaskKey:
    if not version:
        return key
    if isinstance(key, TaskKey):
        return dataclasses.replace(key, version=f"{key.version}+{version}" if key.version is not None else version)
    text = f"{validate_key(key)}@{version}"
    if len(text) > MAX_KEY_LENGTH:
        raise InvalidTaskKey(f"key {key!r} with version {version!r} is longer than {MAX_KEY_LENGTH} characters")
    return text


@overload
def claimed_node(func: F) -> F: ...
@overload
def claimed_node(
    func: None = None, *, key: KeyFunc | None = None, version: str = "",
    lease: float | timedelta | None = None, on_busy: str = "wait", owner: str | None = None,
) -> Callable[[F], F]: ...
def claimed_node(
    func: F | None = None, *, key: KeyFunc | None = None, version: str = "",
    lease: float | timedelta | None = None, on_busy: str = "wait", owner: str | None = None,
) -> F | Callable[[F], F]:
    """Wrap a LangGraph node (sync or async) so that each of its graph steps runs once.

    ``key(state, config)`` overrides the default identity (:func:`node_identity`); ``version``
    is part of the identity either way. While the body runs it holds a claim with keepalive
    (``lease`` seconds, renewed every ``lease / 3``), reachable through :func:`current_claim`.
    The returned state update is stored with ``complete()`` (unless the body completed the
    claim itself inside ``fenced()``). Another execution of the same step returns the stored
    update; while the step runs elsewhere it waits (``on_busy="wait"``, taking over after the
    owner's lease expires) or raises ``TaskBusy`` (``"raise"``). A node fenced off while it runs
    (another worker took the step over) is such a duplicate from then on. A failing body records the
    failure (retry while attempts remain) and re-raises; an ``interrupt()`` releases the claim.
    ``owner`` names the worker in claims and audits (default: ``host:pid:random``).
    """
    check_on_busy(on_busy)
    if not isinstance(version, str):
        raise InvalidTaskKey(f"version must be a string, not {type(version).__name__}")
    if lease is not None:
        lease_seconds(lease)  # bad leases fail at decoration time, not in the middle of a run
    if key is not None and not callable(key):
        raise TypeError("key must be a callable of (state, config) returning a str or TaskKey")

    def decorate(fn: F) -> F:
        return _wrap(fn, key, version, lease, on_busy, owner)

    return decorate(func) if func is not None else decorate


def _wrap(
    fn: F, key: KeyFunc | None, version: str, lease: float | timedelta | None, on_busy: str, owner: str | None,
) -> F:
    takes_config = "config" in inspect.signature(fn).parameters

    def identity(state: Any, config: RunnableConfig) -> str | TaskKey:
        if key is not None:
            return _versioned(key(state, config), version)
        return node_identity(config, version, forks=count_forks(config))

    async def aidentity(state: Any, config: RunnableConfig) -> str | TaskKey:
        if key is not None:
            return _versioned(key(state, config), version)
        return node_identity(config, version, forks=await acount_forks(config))

    def call_args(state: Any, config: RunnableConfig) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (state,), ({"config": config} if takes_config else {})

    wrapper: Callable[..., Any]
    if inspect.iscoroutinefunction(fn):
        aclaim = sync_to_async(claim)

        async def async_node(state: Any, config: RunnableConfig) -> Any:
            task_key = await aidentity(state, config)
            args, kwargs = call_args(state, config)

            async def run(held: Claim) -> Any:
                return (await aexecute(held, fn, args, kwargs, policy=POLICY)).outcome()

            return await arun_by_key(lambda: aclaim(task_key, owner=owner, lease=lease), run, on_busy)

        wrapper = async_node
    else:

        def sync_node(state: Any, config: RunnableConfig) -> Any:
            # LangGraph runs sync nodes on threads of its own pool: a connection this call
            # opens on such a thread is closed again, not left to the thread's end.
            unopened = [connections[alias] for alias in routing.databases() if connections[alias].connection is None]
            try:
                task_key = identity(state, config)
                args, kwargs = call_args(state, config)
                return run_by_key(lambda: claim(task_key, owner=owner, lease=lease),
                                  lambda held: execute(held, fn, args, kwargs, policy=POLICY).outcome(), on_busy)
            finally:
                for conn in unopened:  # the tenant's task database, wherever it is
                    if not conn.in_atomic_block:
                        conn.close()

        wrapper = sync_node

    # Name and docs of the node (add_node() names it by __name__), but not its signature:
    # LangGraph reads the signature to decide what to inject, and the wrapper takes config.
    functools.update_wrapper(wrapper, fn)
    del wrapper.__dict__["__wrapped__"]
    wrapper.__dict__["__signature__"] = inspect.Signature([
        inspect.Parameter("state", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("config", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=RunnableConfig),
    ])
    return wrapper  # type: ignore[return-value]
