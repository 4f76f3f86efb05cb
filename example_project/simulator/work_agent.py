"""An agent process of ``--worker`` mode: a queue worker, its events as JSON on stdout.

    python -m example_project.simulator.work_agent --name agent-1

What ``manage.py taskclaim_worker example_project.testgen.agent.handle_claim --until-drained``
runs: :func:`django_taskclaim.worker.work` claims the requested jobs straight from the task
table (``claim_next``: pending first, then expired leases), runs the core agent's
:func:`~example_project.testgen.agent.handle_claim` on each under ``keepalive()``, and stops once
no job is left unfinished. No message queue: the database is the queue. The events are the
delivery agent's (:mod:`.worker`), so that the driver can pause and kill agents mid-work.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from devtools.events import emit

from .worker import Reporter


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m example_project.simulator.work_agent", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="the agent's owner name in claims")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    import django

    django.setup()
    from django.conf import settings

    from django_taskclaim import signals
    from django_taskclaim.worker import work

    from ..testgen.agent import handle_claim

    report = Reporter(settings.TESTGEN_STEPS, settings.TASKCLAIM_DEFAULT_LEASE)
    taken_over: dict[tuple[str, str], dict[str, Any]] = {}  # claims that took an expired lease over

    def on_takeover(sender: Any, claim: Any, previous_owner: str, previous_token: int, **kw: Any) -> None:
        # Sent when the claim is made, which may be before its handler runs (a batch).
        taken_over[(claim.tenant, claim.key)] = {"previous_owner": previous_owner, "previous_token": previous_token}

    signals.task_taken_over.connect(on_takeover, weak=False)

    def handler(claim: Any) -> None:
        report.start({"delivery": "claim_next", "tenant": claim.tenant, "key": claim.key})
        report.fields.update(taken_over.pop((claim.tenant, claim.key), {}))
        handle_claim(claim, report)

    emit(event="ready", pid=os.getpid(), kind="worker")
    # A short poll: the demo's leases are short, and an agent waits for a paused agent's lease to run out.
    stats = work(handler, owner=args.name, until_drained=True, poll=0.1)
    emit(event="stopped", succeeded=stats.succeeded, failed=stats.failed, fenced_off=stats.fenced_off)


if __name__ == "__main__":
    main()
