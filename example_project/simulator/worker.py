"""An agent process of the demo: deliveries on stdin, the core agent's events as JSON on stdout.

    python -m example_project.simulator.worker --name agent-1 [--langgraph]

It reads one delivery per line (JSON: ``delivery``, ``tenant``, ``run``, ``payload``), as a
queue consumer with a prefetch of one would, hands it to the plain agent
(:func:`example_project.testgen.agent.run_job`) or, with ``--langgraph``, to the agent's graph
(:mod:`example_project.testgen.graph`), and writes what happens as one JSON event per line,
then ``ack``. The lease and the simulated work come from the settings (``TESTGEN_*`` in the
environment that the demo's driver sets).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from devtools.events import emit


class Reporter:
    """The agent's reports as events, with the current delivery's fields and a takeover's."""

    def __init__(self, steps: int, lease: float) -> None:
        self.steps, self.lease = steps, lease
        self.fields: dict[str, Any] = {}
        self.ran = False  # the work ran for this delivery (a graph may return a stored update)
        self.fenced = False  # its claim was fenced off (a graph's node then answers as a duplicate)

    def start(self, delivery: dict[str, Any]) -> None:
        self.fields = {k: delivery[k] for k in ("delivery", "tenant", "key")}
        self.ran = self.fenced = False

    def on_takeover(self, sender: Any, claim: Any, previous_owner: str, previous_token: int, **kw: Any) -> None:
        # The task_taken_over signal: this agent's claim found an expired lease and took it over.
        self.fields.update(previous_owner=previous_owner, previous_token=previous_token)

    def __call__(self, event: str, **fields: Any) -> None:
        if event == "duplicate":
            fields = self.duplicate(fields.pop("task"))
        elif event == "claimed":
            self.ran = True
        elif event == "fenced":
            self.fenced = True
        elif event == "progress":
            fields["of"] = self.steps
        emit(event=event, **fields, **self.fields)

    def duplicate(self, task: Any) -> dict[str, Any]:
        from django.utils import timezone

        retry_in = None
        if task.status == "running":
            # Busy: like a Celery retry, come back when its lease may have run out (the local
            # clock only schedules the retry; the database decides whether the lease expired).
            remaining = task.lease_remaining(timezone.now()) or 0.0
            retry_in = round(min(max(remaining + 0.1, 0.2), self.lease), 2)
        return {
            "status": task.status,
            "owner": task.owner,
            "token": task.fencing_token,
            "retry_in": retry_in,
            "artifact": task.result_ref,
        }


def run_graph(graph: Any, delivery: dict[str, Any], report: Reporter) -> None:
    """One delivery through the graph: its ``claimed_node`` claims, refuses or runs the work."""
    from django_taskclaim.exceptions import StaleClaim, TaskBusy
    from django_taskclaim.models import Task

    try:
        graph.invoke({"tenant": delivery["tenant"], "run": delivery["run"], "payload": delivery["payload"]})
    except TaskBusy as exc:  # on_busy="raise": the queue retries later
        if not report.fenced:  # a node fenced off answers as a duplicate: reported as fenced
            report("duplicate", task=exc.task)
        return
    except StaleClaim as exc:  # run_claimed's answer when nobody holds the task any more
        if not report.fenced:
            report("fenced", token=exc.token, action=exc.action)
        return
    if not report.ran:  # the node's body did not run: the graph got the job's stored update
        report("duplicate", task=Task.objects.get(tenant=delivery["tenant"], key=delivery["key"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m example_project.simulator.worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="the agent's owner name in claims")
    parser.add_argument("--langgraph", action="store_true", help="run each job as a LangGraph graph")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection

    from django_taskclaim import signals

    from ..testgen.agent import run_job
    from ..testgen.jobs import JobSpec

    connection.ensure_connection()
    report = Reporter(settings.TESTGEN_STEPS, settings.TASKCLAIM_DEFAULT_LEASE)
    signals.task_taken_over.connect(report.on_takeover)
    graph = None
    if args.langgraph:
        from ..testgen.graph import build_graph

        graph = build_graph(args.name, report)
    emit(event="ready", pid=os.getpid(), kind="langgraph" if graph else "plain")
    for line in sys.stdin:
        if not line.strip():
            continue
        delivery = json.loads(line)
        report.start(delivery)
        if graph is not None:
            run_graph(graph, delivery, report)
        else:
            spec = JobSpec.from_payload(delivery["tenant"], delivery["run"], delivery["payload"])
            run_job(spec, args.name, delivery_id=delivery["delivery"], report=report)
        emit(event="ack", delivery=delivery["delivery"])


if __name__ == "__main__":
    main()
