"""``manage.py taskclaim_reclaim``: move tasks whose lease expired back to PENDING (or FAILED)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import close_old_connections, connections

from django_taskclaim import outages, routing
from django_taskclaim.lifecycle.api import reclaim_expired_rows
from django_taskclaim.management.arguments import positive_int, positive_seconds
from django_taskclaim.management.base import USAGE_ERROR, TaskClaimCommand
from django_taskclaim.models import HELD_REASON, Task, held_ids
from django_taskclaim.status import Status
from django_taskclaim.stopping import Stop, stop_on_signals
from django_taskclaim.store.rows import Moved


class ReclaimLoop:
    """Runs one round every ``every`` seconds until SIGTERM or SIGINT, then returns."""

    def __init__(self, round_: Any, every: float) -> None:
        self.round, self.every = round_, every
        self.stopping = Stop()

    def run(self) -> None:
        with stop_on_signals(self.stopping):
            while not self.stopping.is_set():
                close_old_connections()
                self.round()
                self.stopping.wait(self.every)


class Command(TaskClaimCommand):
    verbosity = 1
    help = (
        "Move RUNNING tasks whose lease expired (by the database clock) back to PENDING, or to "
        "FAILED when they have no attempts left. Needed for tasks nobody asks for again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true",
                            help="List the expired tasks and what would happen (with --requeue, the "
                                 "messages that would be re-sent); change nothing.")
        parser.add_argument("--limit", type=positive_int, default=None,
                            help="Reclaim at most this many tasks per round (default: %(default)r, no limit).")
        parser.add_argument("--batch-size", type=positive_int, default=500,
                            help="Tasks moved per statement (default: %(default)r).")
        parser.add_argument("--every", type=positive_seconds, default=None, metavar="SECONDS",
                            help="Repeat every SECONDS until SIGTERM/SIGINT (default: %(default)r, run once).")
        parser.add_argument("--requeue", action="store_true",
                            help="Celery bridge: publish again the messages of tasks sent with enqueue_once "
                                 "that were reclaimed, or are still PENDING after --requeue-after seconds "
                                 "(their message was lost).")
        parser.add_argument("--requeue-after", type=positive_seconds, default=None, metavar="SECONDS",
                            help="With --requeue: a PENDING task whose message was last sent longer ago than "
                                 "this is re-sent (default: 300).")
        self.add_database_argument(parser)
        self.add_json_argument(parser)

    requeue = False
    requeue_after: float | None = None
    as_json = False

    def handle(self, *args: Any, dry_run: bool, limit: int | None, batch_size: int,
               every: float | None, requeue: bool = False, requeue_after: float | None = None,
               as_json: bool = False, verbosity: int = 1, database: str | None = None, **options: Any) -> None:
        self.verbosity = verbosity  # BaseCommand passes it as an option, never sets it
        self.as_json = as_json
        self.databases = routing.databases(database)
        self.unreachable: dict[str, str] = {}  # of the last round: alias -> the error
        if limit is not None and batch_size > limit:
            batch_size = limit
        if requeue_after is not None and not requeue:
            raise CommandError("--requeue-after needs --requeue", returncode=USAGE_ERROR)
        if requeue:
            try:
                from django_taskclaim.celery import REQUEUE_AFTER
            except ImportError as exc:
                raise CommandError(f"--requeue needs Celery (pip install django-taskclaim[celery]): {exc}",
                                   returncode=USAGE_ERROR) from exc
            self.requeue = True
            self.requeue_after = REQUEUE_AFTER if requeue_after is None else requeue_after

        def one_round() -> None:
            if dry_run:
                self.dry_round(limit)
            else:
                self.reclaim_round(limit, batch_size)

        if every is None:
            one_round()
            self.fail_if_unreachable("the others were looked at (dry run)" if dry_run else "the others were reclaimed")
        else:
            ReclaimLoop(one_round, every).run()
            if self.verbosity >= 1 and not as_json:
                self.stdout.write("reclaim: stopped")

    def where(self, alias: str) -> str:
        """`` database=ALIAS`` in a line of text, with tasks over several databases."""
        return f" database={alias}" if routing.several() else ""

    def dry_round(self, limit: int | None) -> None:
        tasks: list[tuple[str, Task]] = []
        skipped: list[tuple[str, Task]] = []
        self.unreachable = {}  # of this round

        def look(alias: str) -> None:
            expired = list(Task.objects.db_manager(alias).expired().order_by("id"))
            held = held_ids(alias, [t.pk for t in expired])
            # What a round would take: the first expired tasks no transaction holds (SKIP LOCKED).
            left = None if limit is None else limit - len(tasks)
            tasks.extend([(alias, t) for t in expired if t.pk not in held][:left])
            skipped.extend((alias, t) for t in expired if t.pk in held)

        self.each_database(self.databases, look)
        would = [(alias, Moved(t.pk, t.key, t.tenant, t.fencing_token,
                               Status.PENDING if t.attempts < t.max_attempts else Status.FAILED))
                 for alias, t in tasks]
        resend = self.requeue_candidates(would) if self.requeue else None
        if self.as_json:
            unreachable = {"unreachable": self.unreachable} if self.unreachable else {}
            self.write_json({"dry_run": True, **self.summary(would), **unreachable, "held": self.held_items(skipped),
                             "requeue": resend}, indent=None)
            return
        for (alias, task), (_, row) in zip(tasks, would, strict=True):
            if self.verbosity >= 1:
                self.stdout.write(
                    f"would reclaim {task.key!r} tenant={task.tenant!r} token={task.fencing_token} "
                    f"owner={task.owner!r} attempts={task.attempts}/{task.max_attempts} -> {row.status}"
                    f"{self.where(alias)}"
                )
        self.write_held(skipped, dry_run=True)
        self.stdout.write(f"reclaim (dry run): {len(tasks)} expired task(s) found, nothing changed")
        if resend is not None:
            for item in resend:
                if self.verbosity >= 1:
                    self.stdout.write(f"would re-send {item['key']!r} tenant={item['tenant']!r} "
                                      f"(message {item['celery_task_id'] or '-'})")
            self.stdout.write(f"requeue (dry run): {len(resend)} lost message(s) would be re-sent")

    @staticmethod
    def held_items(tasks: list[tuple[str, Task]]) -> list[dict[str, Any]]:
        return [{"id": t.pk, "key": t.key, "tenant": t.tenant, "token": t.fencing_token, "owner": t.owner,
                 "database": alias} for alias, t in tasks]

    def write_held(self, tasks: list[tuple[str, Task]], *, dry_run: bool) -> None:
        """Say which expired tasks a round leaves alone because a transaction holds them, and why."""
        if not tasks:
            return
        if self.verbosity >= 1:
            for alias, t in tasks:
                self.stdout.write(f"{'would skip' if dry_run else 'skipped'} held {t.key!r} tenant={t.tenant!r} "
                                  f"token={t.fencing_token} owner={t.owner!r}{self.where(alias)}")
        self.stdout.write(f"reclaim{' (dry run)' if dry_run else ''}: {len(tasks)} held task(s) "
                          f"{'would be ' if dry_run else ''}skipped: lease expired, but {HELD_REASON}")

    def requeue_candidates(self, would: list[tuple[str, Moved]]) -> list[dict[str, Any]]:
        """What ``--requeue`` would re-send after this (dry) round, sending nothing."""
        from django_taskclaim.celery import requeue_lost

        return [{"key": i.key, "tenant": i.tenant, "celery_task_id": i.celery_id, "database": alias}
                for alias in self.databases
                for i in requeue_lost([m for a, m in would if a == alias], older_than=self.requeue_after,
                                      using=alias, dry_run=True)]

    @staticmethod
    def summary(rows: list[tuple[str, Moved]]) -> dict[str, Any]:
        pending = sum(1 for _, r in rows if r.status == Status.PENDING)
        return {
            "reclaimed": [{**r._asdict(), "database": alias} for alias, r in rows],
            "pending": pending,
            "failed": len(rows) - pending,
        }

    def reclaim_round(self, limit: int | None, batch_size: int) -> list[tuple[str, Moved]]:
        moved: list[tuple[str, Moved]] = []
        skipped: list[tuple[str, Task]] = []
        unreachable: dict[str, str] = {}
        for alias in self.databases:
            try:
                moved += self.reclaim_database(alias, limit, batch_size, len(moved))
                # The round's SKIP LOCKED passed over the tasks a transaction holds: name them.
                skipped += ((alias, t) for t in Task.objects.db_manager(alias).held().order_by("id"))
            except routing.UNREACHABLE as exc:
                # One task database out of reach must not stop the others' recovery: said, and
                # the command fails once the round is over (a loop goes on to the next round).
                unreachable[alias] = outages.describe(alias, exc)  # the database named once
                self.stderr.write(f"reclaim: {unreachable[alias]}")
                connections[alias].close_if_unusable_or_obsolete()
        summary = self.summary(moved)
        if unreachable:
            summary["unreachable"] = unreachable
        self.unreachable = unreachable
        if not self.as_json:
            self.write_held(skipped, dry_run=False)
            self.stdout.write(
                f"reclaim: {len(moved)} expired task(s): {summary['pending']} back to pending, "
                f"{summary['failed']} failed (no attempts left)"
            )
        sent = self.after_round(moved)
        if self.as_json:
            self.write_json({"dry_run": False, **summary, "held": self.held_items(skipped), "requeue": sent},
                            indent=None)
        return moved

    def reclaim_database(self, alias: str, limit: int | None, batch_size: int,
                         done: int) -> list[tuple[str, Moved]]:
        """Reclaim in batches on database ``alias`` until none is left or ``done`` reached ``limit``."""
        moved: list[tuple[str, Moved]] = []
        while limit is None or done + len(moved) < limit:
            size = batch_size if limit is None else min(batch_size, limit - done - len(moved))
            rows = reclaim_expired_rows(size, using=alias)
            moved += ((alias, r) for r in rows)
            if self.verbosity >= 2 and not self.as_json:
                for r in rows:
                    self.stdout.write(f"reclaimed {r.key!r} tenant={r.tenant!r} token={r.token} -> "
                                      f"{r.status}{self.where(alias)}")
            if len(rows) < size:
                break
        return moved

    def after_round(self, moved: list[tuple[str, Moved]]) -> list[dict[str, Any]] | None:
        """Hook for work after a round: with ``--requeue``, the Celery bridge re-sends lost messages."""
        if not self.requeue:
            return None
        from django_taskclaim.celery import requeue_lost

        sent = [item for alias in self.databases
                for item in requeue_lost([m for a, m in moved if a == alias], older_than=self.requeue_after,
                                         using=alias)]
        failed = [item for item in sent if item.error is not None]
        if not self.as_json:
            if self.verbosity >= 2:
                for item in sent:
                    outcome = f"failed: {item.error}" if item.error else f"sent as {item.celery_id}"
                    self.stdout.write(f"requeue {item.key!r} tenant={item.tenant!r}: {outcome}")
            self.stdout.write(f"requeue: {len(sent) - len(failed)} lost message(s) re-sent")
        for item in failed:
            self.stderr.write(f"requeue {item.key!r} tenant={item.tenant!r} failed: {item.error}")
        return [{"key": i.key, "tenant": i.tenant, "celery_task_id": i.celery_id,
                 "error": None if i.error is None else f"{type(i.error).__name__}: {i.error}"} for i in sent]


__all__ = ["Command", "ReclaimLoop"]
