"""The demo's queue and its chaos: agent processes fed deliveries, duplicated, paused and killed.

:class:`QueueDriver` plays the message queue. It starts ``--agents`` worker processes
(:mod:`.worker`; every second one runs the LangGraph graph), delivers each job ``--copies``
times to them (prefetch 1), redelivers a message whose agent died or did not acknowledge it
within the visibility timeout, and re-sends a job an agent found busy (like a Celery retry).
The queue opens once every agent has started, so that the chaos meets work in flight however
slowly the agents start (a loaded machine). The chaos: the first agent is paused (SIGSTOP) on
its first claim until its job is taken over; the first other agent to make its third model call
is killed (SIGKILL) right after it, mid-work, and replaced (the agent that takes its job over reads
calls one to three from their stored steps).
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.processes import Child, Supervisor

from .client import Job
from .report import Log, short

ROOT = Path(__file__).resolve().parents[2]  # the agents import example_project from here
KILL_AFTER = 3  # model calls (the job's steps) made before the agent is killed (fewer, before its last, if fewer)


@dataclass
class Delivery:
    """One copy of a job's message on its way to an agent."""

    id: str
    tenant: str
    run: str
    key: str
    payload: dict[str, Any]
    why: str = "publish"  # publish | redelivery | retry

    def message(self) -> str:
        return json.dumps(
            {
                "delivery": self.id,
                "tenant": self.tenant,
                "run": self.run,
                "key": self.key,
                "payload": self.payload,
            }
        )


@dataclass
class Agent:
    name: str
    child: Child
    current: Delivery | None = None
    sent_at: float = 0.0
    ready: bool = False
    paused: bool = False
    killed: bool = False
    closing: bool = False
    ended: bool = False  # its output ended: it exited

    def send(self, delivery: Delivery) -> None:
        self.current, self.sent_at = delivery, time.monotonic()
        self.child.send(delivery.message())  # an agent that exited meanwhile is reported by pump()


class QueueDriver:
    """Plays the queue and the chaos for one run; :meth:`run` returns the queue's counts."""

    deliveries_note = ""  # the summary's note on deliveries: the default one

    def __init__(self, args: argparse.Namespace, log: Log) -> None:
        self.args, self.log = args, log
        self.processes = Supervisor(cwd=ROOT)  # the agents: started, read, paused and killed
        self.agents: list[Agent] = []
        self.by_child: dict[Child, Agent] = {}
        self.ready: deque[Delivery] = deque()
        self.scheduled: list[tuple[float, int, Delivery]] = []
        self.redelivered: set[str] = set()  # deliveries already redelivered by the visibility timeout
        self.seq = 0
        self.counts = {"deliveries": 0, "redeliveries": 0, "retries": 0, "drafts_discarded": 0}
        self.pause_target = "agent-1"
        self.opened = False  # deliveries (or claims) begin once every agent has started
        self.pause: dict[str, Any] | None = None  # the paused agent and the claim it holds
        self.paused_done = False
        self.killed_done = False
        self.errors: list[str] = []
        self.published = self.jobs = 0

    # agents ------------------------------------------------------------------------------
    def agent_command(self, name: str) -> list[str]:
        """The agent process's ``python -m`` arguments."""
        # Every second agent runs its jobs through the LangGraph graph (testgen/graph.py).
        langgraph = ["--langgraph"] if len(self.agents) % 2 else []
        return ["example_project.simulator.worker", "--name", name, *langgraph]

    def start_agent(self) -> Agent:
        name = f"agent-{len(self.agents) + 1}"
        # Deliveries go in on stdin, one per line; events come back on stdout.
        child = self.processes.start(
            *self.agent_command(name),
            env=dict(os.environ, PYTHONPATH=str(ROOT)),  # with the TESTGEN_* settings of main()
        )
        agent = Agent(name, child)
        self.agents.append(agent)
        self.by_child[child] = agent
        return agent

    # the queue ---------------------------------------------------------------------------
    def new_delivery(
        self, tenant: str, run: str, key: str, payload: dict[str, Any], why: str
    ) -> Delivery:
        self.seq += 1
        return Delivery(f"d{self.seq}", tenant, run, key, payload, why)

    def copy_of(self, d: Delivery, why: str) -> Delivery:
        return self.new_delivery(d.tenant, d.run, d.key, d.payload, why)

    def publish_all(self, jobs: list[Job]) -> None:
        """Each job ``--copies`` times; copies land near each other, so agents race for them."""
        rng = random.Random(self.args.seed)
        order = []
        for i, (tenant, run, key, payload) in enumerate(jobs):
            for c in range(self.args.copies):
                order.append(
                    (
                        i + (rng.uniform(0, 2.5) if c else 0),
                        self.new_delivery(tenant, run, key, payload, "publish"),
                    )
                )
        self.ready.extend(d for _, d in sorted(order, key=lambda pair: pair[0]))

    def open_when_ready(self) -> bool:
        """Open the queue once every agent has started; True while it is open."""
        if not self.opened and all(a.ready for a in self.agents):
            self.opened = True
            self.log("queue", "open", f"all {len(self.agents)} agents started")
            self.on_open()
        return self.opened

    def on_open(self) -> None:
        """What opening the queue does beyond handing out deliveries: nothing here."""

    def dispatch(self) -> None:
        now = time.monotonic()
        while self.scheduled and self.scheduled[0][0] <= now:
            self.ready.append(heapq.heappop(self.scheduled)[2])
        # The visibility timeout: a message not acknowledged in time goes to another consumer.
        for agent in self.agents:
            d = agent.current
            if d and d.id not in self.redelivered and now - agent.sent_at > self.args.visibility:
                self.redelivered.add(d.id)
                self.counts["redeliveries"] += 1
                self.ready.appendleft(self.copy_of(d, "redelivery"))
                self.log(
                    "queue",
                    "redeliver",
                    f"{d.id} unacknowledged by {agent.name} for "
                    f"{self.args.visibility:.1f}s (visibility timeout)",
                )
        for agent in self.agents:
            if not self.ready:
                break
            if agent.ready and agent.current is None and not agent.killed and not agent.closing:
                d = self.ready.popleft()
                agent.send(d)
                self.counts["deliveries"] += 1

    def idle(self) -> bool:
        return (
            not self.ready
            and not self.scheduled
            and self.pause is None
            and all(a.current is None for a in self.agents if not a.killed)
        )

    # events ------------------------------------------------------------------------------
    def on_event(self, agent: Agent, ev: dict[str, Any]) -> None:
        kind = ev["event"]
        job = short(ev.get("tenant", ""), ev.get("key", ""))
        if kind == "ready":
            agent.ready = True
            kind = " (LangGraph graph)" if ev.get("kind") == "langgraph" else ""
            self.log(agent.name, "started", f"pid {ev['pid']}{kind}")
        elif kind == "claimed":
            if "previous_owner" in ev:
                self.log(
                    agent.name,
                    "TAKEOVER",
                    f"{job}  token {ev['token']} "
                    f"(lease of {ev['previous_owner']}, token {ev['previous_token']}, expired)",
                    always=True,
                )
            else:
                self.log(agent.name, "claimed", f"{job}  token {ev['token']}  [{ev['delivery']}]")
            if agent.name == self.pause_target and not self.paused_done:
                self.stop(agent, ev)
        elif kind == "progress":
            if ev["step"] == 1:
                self.log(agent.name, "working", f"{job}  generating {ev['of']} tests")
            # Killed after its third model call (each stored as a step): whoever takes the job over
            # reads calls one to three from the store and does not call the model for them again.
            kill_at = min(KILL_AFTER, max(1, ev["of"] - 1))
            if agent.name != self.pause_target and not self.killed_done and ev["step"] >= kill_at:
                self.kill(agent, ev["step"])
        elif kind == "duplicate":
            delivery = agent.current
            if ev["retry_in"] is not None and delivery is not None:
                self.log(
                    agent.name,
                    "duplicate",
                    f"{job}  running under {ev['owner']} (token "
                    f"{ev['token']}): refused, retry in {ev['retry_in']:.1f}s  [{ev['delivery']}]",
                )
                self.counts["retries"] += 1
                heapq.heappush(
                    self.scheduled,
                    (
                        time.monotonic() + ev["retry_in"],
                        self.seq,
                        self.copy_of(delivery, "retry"),
                    ),
                )
            else:
                self.log(
                    agent.name,
                    "duplicate",
                    f"{job}  already {ev['status']}: refused, "
                    f"stored result {ev['artifact'] or '-'}  [{ev['delivery']}]",
                )
        elif kind == "published":
            self.published += 1
            self.log(
                agent.name,
                "published",
                f"{job}  token {ev['token']} -> {ev['artifact']}  "
                f"({self.published}/{self.jobs} jobs done)",
            )
        elif kind == "fenced":
            self.counts["drafts_discarded"] += 1
            self.log(
                agent.name,
                "FENCED",
                f"{job}  token {ev['token']}: {ev['action']} refused, "
                "draft discarded (another agent owns the job now)",
                always=True,
            )
        elif kind == "ack" and agent.current and agent.current.id == ev["delivery"]:
            agent.current = None

    def on_exit(self, agent: Agent) -> None:
        agent.ended = True
        if not (agent.killed or agent.closing):
            self.errors.append(f"{agent.name} exited unexpectedly (exit code {agent.child.returncode}); "
                               f"its stderr:\n{agent.child.stderr()[-2000:]}")

    # chaos -------------------------------------------------------------------------------
    def stop(self, agent: Agent, ev: dict[str, Any]) -> None:
        agent.child.stop()
        agent.paused, self.paused_done = True, True
        self.pause = {
            "agent": agent,
            "tenant": ev["tenant"],
            "key": ev["key"],
            "token": ev["token"],
            "since": time.monotonic(),
        }
        self.log(
            "chaos",
            "SIGSTOP",
            f"{agent.name} paused mid-work on {short(ev['tenant'], ev['key'])} "
            f"(token {ev['token']}); it stays paused until its lease ran out and the job was "
            "taken over",
            always=True,
        )

    def maybe_resume(self) -> None:
        from django_taskclaim.models import Task

        p = self.pause
        if p is None:
            return
        taken = Task.objects.filter(
            tenant=p["tenant"], key=p["key"], fencing_token__gt=p["token"]
        ).exists()
        waited = time.monotonic() - p["since"]
        if not taken and waited < 4 * self.args.lease + 2 * self.args.visibility:
            return
        p["agent"].child.cont()
        p["agent"].paused, self.pause = False, None
        self.log(
            "chaos",
            "SIGCONT",
            f"{p['agent'].name} resumed after {waited:.1f}s"
            + ("; its job has a newer owner" if taken else "; nobody took the job over"),
            always=True,
        )

    def kill(self, agent: Agent, calls: int | None = None) -> None:
        agent.killed, self.killed_done = True, True
        agent.child.kill()
        agent.child.wait(15)
        after = f" after model call {calls} (stored: its successor does not call again)" if calls else ""
        self.log("chaos", "SIGKILL", f"{agent.name} killed mid-work{after}", always=True)
        if agent.current is not None:
            # The consumer is gone with an unacknowledged message: the queue redelivers it.
            self.counts["redeliveries"] += 1
            self.ready.appendleft(self.copy_of(agent.current, "redelivery"))
            self.log("queue", "redeliver", f"{agent.current.id} of the killed {agent.name}")
            agent.current = None
        replacement = self.start_agent()
        self.log("chaos", "restart", f"{replacement.name} replaces {agent.name}", always=True)

    # main loop ---------------------------------------------------------------------------
    def banner(self) -> str:
        a = self.args
        return (
            f"django-taskclaim demo: {a.jobs} jobs, {a.agents} agents, each job delivered "
            f"{a.copies}x, lease {a.lease:g}s, work {a.work_seconds:g}s"
        )

    def run(self, jobs: list[Job]) -> dict[str, int]:
        for _ in range(self.args.agents):
            self.start_agent()
        self.jobs = len(jobs)
        self.publish_all(jobs)
        deadline = time.monotonic() + self.args.timeout
        last_poll = 0.0
        try:
            while not self.errors:
                if time.monotonic() > deadline:
                    self.errors.append(f"gave up after --timeout {self.args.timeout:.0f}s")
                    break
                if self.open_when_ready():
                    self.dispatch()
                self.pump(0.05)
                if time.monotonic() - last_poll > 0.1:
                    last_poll = time.monotonic()
                    self.maybe_resume()
                if self.idle():
                    break
        finally:
            self.shutdown()
        return self.counts

    def pump(self, timeout: float) -> None:
        """Handle the agents' events: wait up to ``timeout`` for one, then take what else arrived;
        then the exits of agents whose output had ended before (so all their events came first)."""
        ended = [a for a in self.agents if not a.ended and a.child.ended()]
        got = self.processes.next(timeout)
        while got is not None:
            self.on_event(self.by_child[got[0]], got[1])
            got = self.processes.next(0)
        for agent in ended:
            self.on_exit(agent)

    def shutdown(self) -> None:
        for agent in self.agents:
            if agent.paused:
                agent.child.cont()
            if agent.child.alive():
                agent.closing = True
                agent.child.end_input()  # no more deliveries: the agent finishes and exits
        for agent in self.agents:
            try:
                agent.child.wait(15)
            except TimeoutError:
                agent.child.kill()
                agent.child.wait(15)
                self.errors.append(f"{agent.name} did not stop within 15s; killed")
        while (got := self.processes.next(0)) is not None:
            if got[1]["event"] != "ack":
                self.on_event(self.by_child[got[0]], got[1])
        self.processes.close()

