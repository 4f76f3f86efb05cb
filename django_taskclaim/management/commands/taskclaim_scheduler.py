"""``manage.py taskclaim_scheduler``: fire the ticks of ``TASKCLAIM_SCHEDULES`` (see
:mod:`django_taskclaim.schedules`). Run as many as you like, on any host: each tick is a task
identity, enqueued once whoever fires it."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_taskclaim.management.base import USAGE_ERROR, TaskClaimCommand
from django_taskclaim.schedules import ScheduleError, Scheduler
from django_taskclaim.stopping import Stop, stop_on_signals


class Command(TaskClaimCommand):
    help = ("Enqueue the due ticks of TASKCLAIM_SCHEDULES, each once however many schedulers run; "
            "loops until SIGTERM/SIGINT (or --once).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true",
                            help="Fire what is due now (by each schedule's catch-up policy; a schedule that "
                                 "never fired: its newest tick) and exit: for cron.")
        self.add_json_argument(parser)

    def handle(self, *args: Any, once: bool, as_json: bool = False, **options: Any) -> None:
        try:
            scheduler = Scheduler()
        except ScheduleError as exc:
            raise CommandError(str(exc), returncode=USAGE_ERROR) from exc
        if not scheduler.schedules:
            raise CommandError("TASKCLAIM_SCHEDULES names no schedule: nothing to fire", returncode=USAGE_ERROR)
        if once:
            # No memory between two runs from cron: a schedule that never fired fires its newest
            # tick, else each run would start afresh and fire nothing.
            scheduler.run_pending(first=True)
        else:
            with stop_on_signals(Stop()) as stop:
                scheduler.run(stop)
        if as_json:
            self.write_json({"fired": scheduler.fired}, indent=None)
        else:
            self.stdout.write(f"taskclaim_scheduler: {scheduler.fired} tick(s) enqueued")
