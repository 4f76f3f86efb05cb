"""An agent process of ``--worker`` mode: a ``taskclaim_worker``, its events as JSON on stdout.

    python -m example_project.simulator.work_agent --name agent-1

What ``manage.py taskclaim_worker --queue testgen --until-drained --owner agent-1 --concurrency N`` runs:
:func:`django_taskclaim.worker.work` with the Django Tasks backend's ``TaskRunner`` claims the
jobs that the job API enqueued through Django's Tasks framework (``claim_next``: due tasks of the
``testgen`` queue, and tasks whose lease expired), runs the task
:func:`~example_project.testgen.jobs_tasks.generate_suite` on each under ``keepalive()``, and
stops once no job is left unfinished; up to ``--concurrency`` jobs at once, each on a thread of its
own with its own connection, their leases renewed together. No message queue: the database is the queue. The events
are the delivery agent's (:mod:`.worker`), so that the driver can pause and kill agents mid-work.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import Any

from devtools.events import emit

from .worker import Reporter


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m example_project.simulator.work_agent", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="the agent's owner name in claims")
    parser.add_argument("--concurrency", type=int, default=1, help="jobs run at once (default: 1)")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    import django

    django.setup()
    from django.conf import settings

    from django_taskclaim import signals
    from django_taskclaim.tasks import current_claim
    from django_taskclaim.tasks.runner import TaskRunner
    from django_taskclaim.worker import work

    from ..testgen.jobs_tasks import job_event

    # One report per slot thread: each runs one job at a time, and its events carry that job's fields.
    reports = threading.local()

    def report_here() -> Reporter:
        if not hasattr(reports, "report"):
            reports.report = Reporter(settings.TESTGEN_STEPS, settings.TASKCLAIM_DEFAULT_LEASE)
        return reports.report
    taken_over: dict[tuple[str, str], dict[str, Any]] = {}  # claims that took an expired lease over
    lock = threading.Lock()

    def on_takeover(sender: Any, claim: Any, previous_owner: str, previous_token: int, **kw: Any) -> None:
        # Sent when the claim is made, which may be before its task runs (a batch).
        with lock:
            taken_over[(claim.tenant, claim.key)] = {"previous_owner": previous_owner, "previous_token": previous_token}

    def on_job_event(sender: Any, event: str, **fields: Any) -> None:
        report = report_here()
        if event == "claimed":  # the task started under its claim: the job's fields from now on
            claim = current_claim()
            report.start({"delivery": f"task {claim.task_id}", "tenant": claim.tenant, "key": claim.key})
            with lock:
                report.fields.update(taken_over.pop((claim.tenant, claim.key), {}))
        report(event, **fields)

    signals.task_taken_over.connect(on_takeover, weak=False)
    job_event.connect(on_job_event, weak=False)
    emit(event="ready", pid=os.getpid(), kind="worker")
    # The driver says "start" once every agent is up; the end of stdin instead means the demo is over.
    if not sys.stdin.readline():
        emit(event="stopped", succeeded=0, failed=0, fenced_off=0)
        return
    # A short poll: the demo's leases are short, and an agent waits for a paused agent's lease to run out.
    # batch=1: each agent claims one job a statement (a concurrent worker's default batch would let
    # two agents take all six jobs, and the first agent, the one the chaos pauses, none).
    stats = work(TaskRunner("default"), owner=args.name, queue="testgen", until_drained=True, poll=0.1,
                 concurrency=args.concurrency, batch=1)
    emit(event="stopped", succeeded=stats.succeeded, failed=stats.failed, fenced_off=stats.fenced_off)


if __name__ == "__main__":
    main()
