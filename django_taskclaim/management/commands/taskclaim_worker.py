"""``manage.py taskclaim_worker HANDLER``: a queue worker (see :mod:`django_taskclaim.worker`)."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.module_loading import import_string

from django_taskclaim.keys import MIN_LEASE
from django_taskclaim.management.arguments import lease, owner_name, positive_int, tenant_name
from django_taskclaim.management.base import USAGE_ERROR, TaskClaimCommand
from django_taskclaim.worker import work


class Command(TaskClaimCommand):
    help = (
        "Claim queued tasks (PENDING, or RUNNING with an expired lease) and run HANDLER(claim) on "
        "each, storing its result; one commit per task. Stops on SIGTERM/SIGINT after the task in hand."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("handler", help="Dotted path of a callable taking the claim and returning the result.")
        parser.add_argument("--tenant", type=tenant_name, default=None, help="Only this tenant's tasks.")
        parser.add_argument("--lease", type=lease, default=None,
                            help=f"Lease in seconds, from {MIN_LEASE:g} to TASKCLAIM_MAX_LEASE "
                                 "(default: TASKCLAIM_DEFAULT_LEASE).")
        parser.add_argument("--batch", type=positive_int, default=1, help="Tasks claimed at a time (default: 1).")
        parser.add_argument("--max-tasks", type=positive_int, default=None, help="Stop after this many tasks.")
        parser.add_argument("--until-drained", action="store_true",
                            help="Stop once no task is left unfinished (pending, or running elsewhere).")
        parser.add_argument("--atomic", action="store_true",
                            help="Run the handler inside claim.fenced(): its writes commit with the completion.")
        parser.add_argument("--owner", type=owner_name, default=None,
                            help="Worker identity, 255 characters at most (default: host:pid:random).")
        self.add_json_argument(parser)

    def handle(self, *args: Any, handler: str, tenant: str | None, lease: float | None, batch: int,
               max_tasks: int | None, until_drained: bool, atomic: bool, owner: str | None, as_json: bool = False,
               **options: Any) -> None:
        try:
            func = import_string(handler)
        except ImportError as exc:
            raise CommandError(f"handler {handler!r} cannot be imported: {exc}", returncode=USAGE_ERROR) from exc
        if not callable(func):
            raise CommandError(f"handler {handler!r} is not callable", returncode=USAGE_ERROR)
        stop = threading.Event()
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            stats = work(func, owner=owner, lease=lease, tenant=tenant, batch=batch, max_tasks=max_tasks,
                         until_drained=until_drained, atomic=atomic, stop=stop)
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
        summary = {"succeeded": stats.succeeded, "failed": stats.failed, "fenced_off": stats.fenced_off}
        if as_json:
            self.write_json(summary, indent=None)
        else:
            self.stdout.write(f"taskclaim_worker: {stats.succeeded} succeeded, {stats.failed} failed, "
                              f"{stats.fenced_off} fenced off")
