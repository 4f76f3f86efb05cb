"""``manage.py taskclaim_purge``: delete finished tasks (and their attempts) older than a cutoff."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import CommandParser
from django.db.models import Count

from django_taskclaim import routing
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
        self.add_database_argument(parser)
        self.add_json_argument(parser)

    def handle(self, *args: Any, older_than: timedelta, status: list[str] | None, batch_size: int,
               dry_run: bool, as_json: bool = False, verbosity: int = 1, database: str | None = None,
               **options: Any) -> None:
        self.verbosity = verbosity
        statuses = sorted(set(status or TERMINAL))
        reports = self.each_database(routing.databases(database), lambda alias: self.purge(
            alias, older_than, statuses, batch_size, dry_run, as_json))
        if not reports:
            self.fail_if_unreachable("nothing was purged")
        several = routing.several()
        if dry_run:
            by_status: dict[str, int] = {}
            for report in reports:
                for name, n in report["by_status"].items():
                    by_status[name] = by_status.get(name, 0) + n
            document = {"dry_run": True, "cutoff": reports[0]["cutoff"], "statuses": statuses,
                        "tasks": sum(r["tasks"] for r in reports), "by_status": by_status,
                        "attempts": sum(r["attempts"] for r in reports)}
        else:
            document = {"dry_run": False, "cutoff": reports[0]["cutoff"], "statuses": statuses,
                        "tasks": sum(r["tasks"] for r in reports), "attempts": sum(r["attempts"] for r in reports)}
        if several:
            document["databases"] = {r["database"]: {k: v for k, v in r.items() if k != "database"} for r in reports}
        if self.unreachable:
            document["unreachable"] = self.unreachable
        if as_json:
            self.write_json(document, indent=None)
            self.fail_if_unreachable("the others were purged" if not dry_run else "the others were counted")
            return
        if dry_run:
            if self.verbosity >= 1:
                for report in reports:
                    for name in sorted(report["by_status"]):
                        where = f" in {report['database']}" if several else ""
                        self.stdout.write(f"would delete {report['by_status'][name]} {name} task(s){where}")
            self.stdout.write(
                f"purge (dry run): {document['tasks']} task(s) and {document['attempts']} attempt(s) last "
                f"updated before {self.cutoffs(reports)} would be deleted; nothing changed")
        else:
            self.stdout.write(
                f"purge: deleted {document['tasks']} task(s) and {document['attempts']} attempt(s) "
                f"({', '.join(statuses)}; last updated before {self.cutoffs(reports)})")
        self.fail_if_unreachable("the others were purged" if not dry_run else "the others were counted")

    @staticmethod
    def cutoffs(reports: list[dict[str, Any]]) -> str:
        """The cutoff (each database's, by its own clock, when there are several)."""
        if len(reports) == 1:
            return str(reports[0]["cutoff"].isoformat())
        return ", ".join(f"{r['cutoff'].isoformat()} in {r['database']}" for r in reports)

    def purge(self, alias: str, older_than: timedelta, statuses: list[str], batch_size: int, dry_run: bool,
              as_json: bool) -> dict[str, Any]:
        """Purge (or count, ``dry_run``) on task database ``alias``; what it found, as a report."""
        tasks = Task.objects.db_manager(alias).get_queryset()
        # The cutoff is read from the database clock, which wrote updated_at: a process whose
        # own clock runs ahead would otherwise purge tasks that finished a moment ago.
        cutoff = database_now(alias) - older_than
        candidates = tasks.filter(status__in=statuses, updated_at__lt=cutoff)
        if dry_run:
            counts = dict(candidates.order_by().values_list("status").annotate(n=Count("pk")))
            attempts = Attempt.objects.using(alias).filter(task__in=candidates).count()
            return {"database": alias, "cutoff": cutoff, "tasks": sum(counts.values()), "by_status": counts,
                    "attempts": attempts}
        total = candidates.count()
        progress = self.stdout.isatty() and self.verbosity >= 1 and not as_json
        deleted_tasks = deleted_attempts = 0
        while True:
            deleted, attempts = self.delete_batch(alias, statuses, cutoff, batch_size)
            deleted_tasks += deleted
            deleted_attempts += attempts
            if progress and total:
                self.stdout.write(f"\rpurged {deleted_tasks}/{total} task(s) in {alias}", ending="")
                self.stdout.flush()
            if deleted < batch_size:
                break
        if progress and total:
            self.stdout.write("")
        return {"database": alias, "cutoff": cutoff, "tasks": deleted_tasks, "attempts": deleted_attempts}

    def delete_batch(self, using: str, statuses: list[str], cutoff: datetime, batch_size: int) -> tuple[int, int]:
        """Delete one batch in its own transaction; returns (tasks, attempts) deleted."""
        return transitions.purge(using, statuses=statuses, before=cutoff, limit=batch_size)


__all__ = ["Command"]
