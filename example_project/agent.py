"""An agent: a worker process that receives deliveries of jobs and generates their test suites.

    python -m example_project.agent --name agent-1 --lease 2 --work-seconds 1

It reads one delivery per line on stdin (JSON: ``delivery``, ``tenant``, ``run``, ``key``,
``payload``), as a queue consumer with a prefetch of one would, and writes one JSON event per
line on stdout; the demo's driver plays the queue and reads the events. For each delivery:

1. claim the job by its key (the claim creates nothing new: the job was requested already);
2. a duplicate (the job is running elsewhere, or done) is refused without doing the work;
3. otherwise generate the suite under ``keepalive()`` and publish it through ``fenced()``;
   a ``StaleClaim`` on the way means another agent took over: the draft is thrown away.

With ``--langgraph`` the agent runs each delivery through a real LangGraph graph instead
(:mod:`example_project.graph_agent`), whose ``claimed_node`` does steps 1-3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from django.utils import timezone


def emit(**event: Any) -> None:
    print(json.dumps(event), flush=True)


def handle(delivery: dict[str, Any], args: argparse.Namespace) -> None:
    from django_taskclaim import signals
    from django_taskclaim.exceptions import StaleClaim
    from django_taskclaim.models import Task

    from .testgen.jobs import JobSpec
    from .testgen.work import discard, generate_suite, publish

    did, key, tenant = delivery["delivery"], delivery["key"], delivery["tenant"]
    spec = JobSpec.from_payload(tenant, delivery["run"], delivery["payload"])
    base = {"delivery": did, "key": key, "tenant": tenant}
    takeover: dict[str, Any] = {}

    def on_takeover(
        sender: Any, claim: Any, previous_owner: str, previous_token: int, **kw: Any
    ) -> None:
        takeover.update(previous_owner=previous_owner, previous_token=previous_token)

    signals.task_taken_over.connect(on_takeover)
    try:
        outcome = Task.objects.claim(
            key,
            tenant,
            owner=args.name,
            lease=args.lease,
            payload=delivery["payload"],
            delivery_id=did,
        )
    finally:
        signals.task_taken_over.disconnect(on_takeover)
    if not outcome.claimed:
        task = outcome.task
        retry_in = None
        if task.status == Task.Status.RUNNING:
            # Busy: like a Celery retry, come back when its lease may have run out (the local
            # clock only schedules the retry; the database decides whether the lease expired).
            remaining = task.lease_remaining(timezone.now()) or 0.0
            retry_in = round(min(max(remaining + 0.1, 0.2), args.lease), 2)
        emit(
            event="duplicate",
            status=task.status,
            owner=task.owner,
            token=task.fencing_token,
            retry_in=retry_in,
            artifact=task.result_ref,
            **base,
        )
        return
    claim = outcome.claim
    if claim is None:  # claimed=True always carries a claim
        raise RuntimeError(f"claim of {key!r} reported success without a claim")
    emit(event="claimed", token=claim.token, **takeover, **base)
    rel = ""
    try:
        with claim.keepalive():
            rel, tests = generate_suite(
                claim,
                spec,
                args.name,
                work_seconds=args.work_seconds,
                steps=args.steps,
                on_step=lambda step: emit(event="progress", step=step, of=args.steps, **base),
            )
        publish(claim, spec, args.name, rel, tests)
    except StaleClaim as exc:
        if rel:
            discard(rel)
        emit(event="fenced", token=claim.token, action=exc.action, **base)
        return
    emit(event="published", token=claim.token, artifact=rel, tests=tests, **base)


def handle_with_graph(delivery: dict[str, Any], args: argparse.Namespace, graph: Any, base: dict[str, Any]) -> None:
    """Steps 1-3 through the LangGraph graph: its ``claimed_node`` claims, refuses or runs."""
    from django_taskclaim import signals
    from django_taskclaim.exceptions import StaleClaim, TaskBusy
    from django_taskclaim.models import Task

    did, key, tenant = delivery["delivery"], delivery["key"], delivery["tenant"]
    base.clear()
    base.update(delivery=did, key=key, tenant=tenant)
    ran: list[int] = []

    def on_claim(sender: Any, claim: Any, takeover: bool, **kw: Any) -> None:
        ran.append(claim.token)

    def on_takeover(sender: Any, claim: Any, previous_owner: str, previous_token: int, **kw: Any) -> None:
        base.update(previous_owner=previous_owner, previous_token=previous_token)

    signals.task_claimed.connect(on_claim)
    signals.task_taken_over.connect(on_takeover)
    try:
        final = graph.invoke({"tenant": tenant, "run": delivery["run"], "payload": delivery["payload"]})
    except TaskBusy as exc:
        remaining = exc.task.lease_remaining(timezone.now()) or 0.0
        emit(event="duplicate", status="running", owner=exc.task.owner, token=exc.task.fencing_token,
             retry_in=round(min(max(remaining + 0.1, 0.2), args.lease), 2), artifact="", **base)
        return
    except StaleClaim as exc:
        emit(event="fenced", token=ran[-1] if ran else None, action=exc.action, **base)
        return
    finally:
        signals.task_claimed.disconnect(on_claim)
        signals.task_taken_over.disconnect(on_takeover)
    task = Task.objects.get(tenant=tenant, key=key)
    if ran and final["token"] == ran[-1]:
        emit(event="published", token=final["token"], artifact=task.result_ref, tests=final["tests"], **base)
    else:  # the node's body did not run: the graph got the job's stored state update
        emit(event="duplicate", status=task.status, owner=task.owner, token=task.fencing_token,
             retry_in=None, artifact=task.result_ref, **base)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m example_project.agent",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--name", required=True, help="the agent's owner name in claims")
    parser.add_argument(
        "--lease", type=float, default=30.0, help="lease seconds (default: %(default)r)"
    )
    parser.add_argument(
        "--work-seconds",
        type=float,
        default=1.0,
        help="simulated generation time per job (default: %(default)r)",
    )
    parser.add_argument(
        "--steps", type=int, default=4, help="tests per suite (default: %(default)r)"
    )
    parser.add_argument(
        "--langgraph", action="store_true", help="run each job as a LangGraph graph (graph_agent.py)"
    )
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    import django

    django.setup()
    from django.db import connection

    connection.ensure_connection()
    graph, base = None, {}
    if args.langgraph:
        from .graph_agent import build_graph

        # The node's events carry the current delivery's fields (and a takeover's, on "claimed").
        graph = build_graph(args, lambda **event: emit(**event, **base))
    emit(event="ready", pid=os.getpid(), kind="langgraph" if graph else "plain")
    for line in sys.stdin:
        if line.strip():
            delivery = json.loads(line)
            if graph is not None:
                handle_with_graph(delivery, args, graph, base)
            else:
                handle(delivery, args)
            emit(event="ack", delivery=delivery["delivery"])


if __name__ == "__main__":
    main()
