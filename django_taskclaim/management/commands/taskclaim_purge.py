"""``manage.py taskclaim_purge``: delete finished tasks (and their attempts) older than a cutoff."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import CommandParser
from django.db.models import Count

from django_taskclaim.lifecycle import transitions
from django_taskclaim.management.arguments import TERMINAL, duration, positive_int, terminal_status
from django_taskclaim.management.base import TaskClaimCommand, database_now
from django_taskclaim.models import Attempt, Task


class Command(TaskClaimCommand):
    verbosity = 1
    help = (
        "Delete finished tasks (succeeded, failed, cancelled) last updated longer ago than "
        "--older-than (by the database clock), with their attempt history. One transaction "
        "per batch."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", type=duration, required=True, metavar="DURATION",
                            help="Age of the last update, e.g. 30d, 12h, 15m, 90s, 1h30m.")
        parser.add_argument("--status", type=terminal_status, action="extend", nargs="+",
                            metavar="STATUS", default=None,
                            help="Only tasks in these finished statuses "
                                 f"(default: all of {', '.join(TERMINAL)}).")
        parser.add_argument("--batch-size", type=positive_int, default=1000,
                            help="Tasks deleted per transaction (default: %(default)r).")
        parser.add_argument("--dry-run", action="store_true",
                            help="Count what would be deleted; delete nothing.")
        self.add_json_argument(parser)

    def handle(self, *args: Any, older_than: timedelta, status: list[str] | None, batch_size: int,
               dry_run: bool, as_json: bool = False, verbosity: int = 1,
               **options: Any) -> None:
        self.verbosity = verbosity
        statuses = sorted(set(status or TERMINAL))
        tasks = Task.objects.get_queryset()  # on TASKCLAIM_DATABASE
        # The cutoff is read from the database clock, which wrote updated_at: a process whose
        # own clock runs ahead would otherwise purge tasks that finished a moment ago.
        cutoff = database_now(tasks.db) - older_than
        candidates = tasks.filter(status__in=statuses, updated_at__lt=cutoff)
        if dry_run:
            self.dry_run(candidates, cutoff, statuses, as_json)
            return
        total = candidates.count()
        progress = self.stdout.isatty() and self.verbosity >= 1 and not as_json
        deleted_tasks = deleted_attempts = 0
        while True:
            deleted, attempts = self.delete_batch(tasks.db, statuses, cutoff, batch_size)
            deleted_tasks += deleted
            deleted_attempts += attempts
            if progress and total:
                self.stdout.write(f"\rpurged {deleted_tasks}/{total} task(s)", ending="")
                self.stdout.flush()
            if deleted < batch_size:
                break
        if progress and total:
            self.stdout.write("")
        if as_json:
            self.write_json({"dry_run": False, "cutoff": cutoff, "statuses": statuses,
                             "tasks": deleted_tasks, "attempts": deleted_attempts}, indent=None)
            return
        self.stdout.write(
            f"purge: deleted {deleted_tasks} task(s) and {deleted_attempts} attempt(s) "
            f"({', '.join(statuses)}; last updated before {cutoff.isoformat()})")

    def delete_batch(self, using: str, statuses: list[str], cutoff: datetime, batch_size: int) -> tuple[int, int]:
        """Delete one batch in its own transaction; returns (tasks, attempts) deleted."""
        return transitions.purge(using, statuses=statuses, before=cutoff, limit=batch_size)

    def dry_run(self, candidates: Any, cutoff: datetime, statuses: list[str], as_json: bool) -> None:
        counts = dict(candidates.order_by().values_list("status").annotate(n=Count("pk")))
        attempts = Attempt.objects.using(candidates.db).filter(task__in=candidates).count()
        if as_json:
            self.write_json({"dry_run": True, "cutoff": cutoff, "statuses": statuses,
                             "tasks": sum(counts.values()), "by_status": counts,
                             "attempts": attempts}, indent=None)
            return
        if self.verbosity >= 1:
            for name in sorted(counts):
                self.stdout.write(f"would delete {counts[name]} {name} task(s)")
        self.stdout.write(
            f"purge (dry run): {sum(counts.values())} task(s) and {attempts} attempt(s) last "
            f"updated before {cutoff.isoformat()} would be deleted; nothing changed")


__all__ = ["Command"]
