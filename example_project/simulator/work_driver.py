"""``--worker``: the jobs are Django tasks and the agents run ``taskclaim_worker``: no message queue.

:class:`WorkerDriver` starts ``--agents`` :mod:`.work_agent` processes, each running
:func:`django_taskclaim.worker.work` with the Django Tasks backend's ``TaskRunner`` (as
``manage.py taskclaim_worker --queue testgen`` does) until no job is left unfinished. Nothing is
delivered: ``POST /api/jobs`` enqueued each job through Django's Tasks framework (once, however
often it was requested), and each agent claims the next one from the task table (``FOR UPDATE
SKIP LOCKED`` on PostgreSQL). The chaos is the delivery demo's: the agents begin claiming once all of them
have started, the first agent is paused (SIGSTOP) on its first claim until its job is taken
over, the first other agent to start working is killed (SIGKILL) mid-work and replaced; a job
whose lease ran out goes to the next agent that asks for work.
"""

from __future__ import annotations

from typing import Any

from .client import Job
from .driver import Agent, QueueDriver


class WorkerDriver(QueueDriver):
    """Starts the queue workers and plays the chaos; ``run()`` returns when they all stopped."""

    deliveries_note = "none: Django tasks, each claimed by a taskclaim_worker from the task table"

    def agent_command(self, name: str) -> list[str]:
        return ["example_project.simulator.work_agent", "--name", name, "--concurrency", str(self.args.concurrency)]

    def banner(self) -> str:
        a = self.args
        return (
            f"django-taskclaim demo (--worker): {a.jobs} jobs enqueued through Django's Tasks framework, "
            f"{a.agents} taskclaim_worker agents of {a.concurrency} jobs at once, lease {a.lease:g}s, "
            f"work {a.work_seconds:g}s"
        )

    def on_event(self, agent: Agent, ev: dict[str, Any]) -> None:
        if ev["event"] == "ready":
            agent.ready = True
            self.log(agent.name, "started", f"pid {ev['pid']} (taskclaim_worker --queue testgen)")
            if self.opened:  # a replacement: it starts claiming at once
                agent.child.send("start")
        elif ev["event"] == "stopped":
            agent.closing = True  # drained: nothing left unfinished
            self.log(agent.name, "drained", f"{ev['succeeded']} published, {ev['fenced_off']} fenced off")
        else:
            super().on_event(agent, ev)

    # The queue's loop (QueueDriver.run) with no queue: nothing to publish or hand out, and the
    # run is over once every agent still alive has drained the task table and exited.
    def publish_all(self, jobs: list[Job]) -> None:
        return None

    def dispatch(self) -> None:
        return None

    def on_open(self) -> None:
        for agent in self.agents:  # each agent waits for this line before its first claim
            agent.child.send("start")

    def idle(self) -> bool:
        return self.pause is None and all(not a.child.alive() for a in self.agents if not a.killed)
