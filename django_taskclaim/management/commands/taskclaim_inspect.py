"""``manage.py taskclaim_inspect KEY``: one task's state, the timeline of its attempts and its stored
steps (or
``--id ID``: the task by its id, a Django task's result id); ``manage.py taskclaim_inspect`` (no key):
each queue's depth and the age of its oldest due task."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_taskclaim import routing
from django_taskclaim.dashboard import progress_text
from django_taskclaim.exceptions import DatabaseUnreachable
from django_taskclaim.ids import parse_task_id, task_id
from django_taskclaim.management.arguments import task_database, task_key, tenant_name
from django_taskclaim.management.base import UNREACHABLE, USAGE_ERROR, TaskClaimCommand
from django_taskclaim.models import HELD_REASON, Attempt, Step, Task, held_ids
from django_taskclaim.status import RESULT_STATUS, Status
from django_taskclaim.store import DbNow

NOT_FOUND = 1


@contextmanager
def reading(using: str) -> Iterator[None]:
    """Reads of the one task database that holds the task asked for: one that cannot be reached,
    among several (``routing.reaching``), ends the command with one line naming it (exit 3), not a
    traceback."""
    try:
        with routing.reaching(using):
            yield
    except DatabaseUnreachable as exc:
        raise CommandError(str(exc), returncode=UNREACHABLE) from exc


def task_as_dict(task: Task, lease_remaining: float | None, held: bool = False) -> dict[str, Any]:
    fields = ("id", "tenant", "key", "status", "owner", "fencing_token", "attempts", "max_attempts",
              "lease_expires_at", "payload", "payload_fingerprint", "result", "result_ref", "error",
              "dispatch", "created_at", "updated_at", "queue", "priority", "run_after", "task_path",
              "progress", "progress_note", "progress_token")
    data = {name: getattr(task, name) for name in fields}
    data["lease_remaining"] = lease_remaining
    data["held"] = held
    return data


def step_as_dict(step: Step) -> dict[str, Any]:
    """A stored step as ``--json`` shows it: its name, result, the token that stored it, and when."""
    return {"name": step.name, "result": step.result, "token": step.token, "stored_at": step.created_at}


def seconds_between(attempt: Attempt) -> float | None:
    if attempt.started_at is None or attempt.ended_at is None:
        return None
    return (attempt.ended_at - attempt.started_at).total_seconds()


def result_status(task: Task) -> str:
    """What Django's Tasks framework reports for a task (``status.RESULT_STATUS``), and why where
    the word hides it (a cancelled task is reported FAILED)."""
    word = RESULT_STATUS[task.status]
    return f"{word} (TaskCancelled)" if task.status == Status.CANCELLED else word


class Command(TaskClaimCommand):
    help = ("Show one task (by key and tenant, or by --id), the timeline of its attempts and its stored steps; "
            "with no key, each queue's depth (due, deferred, running) and how long its oldest due task has waited.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("key", type=task_key, nargs="?", default=None,
                            help="The task's key (none: the queues).")
        parser.add_argument("--tenant", type=tenant_name, default="",
                            help="The task's tenant (default: %(default)r).")
        parser.add_argument("--database", type=task_database, default=None, metavar="ALIAS",
                            help="The task database to look in (default: the tenant's, by TASKCLAIM_ROUTER; "
                                 "with no key: every one).")
        parser.add_argument("--id", dest="task_ref", default=None, metavar="ID",
                            help="The task with this id instead of a key: a Django task's result id, alias:pk "
                                 "(or the primary key alone, in --database or the only task database).")
        self.add_json_argument(parser)

    def handle(self, *args: Any, key: str | None, tenant: str, as_json: bool, database: str | None = None,
               task_ref: str | None = None, **options: Any) -> None:
        if task_ref is not None:
            key, tenant, database = self.named_by_id(task_ref, key, database)
        if key is None:
            stats = [{**q, "database": alias} for alias, found in self.each_database(
                routing.databases(database), lambda alias: (alias, Task.objects.db_manager(alias).queue_stats()))
                for q in found]
            self.write_queues(stats, as_json)
            self.fail_if_unreachable("the others' queues are listed")
            return
        using = database or routing.route(tenant)
        with reading(using):  # the task is there or nowhere: nothing else to show
            task = Task.objects.db_manager(using).annotate(db_now=DbNow()).filter(tenant=tenant, key=key).first()
        if task is None:
            others = [(alias, found) for alias, tenants in self.each_database(
                routing.databases(database), lambda alias: (alias, list(
                    Task.objects.db_manager(alias).filter(key=key).order_by("tenant")
                    .values_list("tenant", flat=True)[:10]))) for found in tenants]
            named = [f"{found!r} (in {alias})" if routing.several() else repr(found) for alias, found in others]
            hint = f"; it exists for tenant(s) {', '.join(named[:10])}" if others else ""
            where = f" in database {using!r}" if routing.several() else ""
            raise CommandError(f"no task {key!r} for tenant {tenant!r}{where}{hint}", returncode=NOT_FOUND)
        db_now = task.db_now
        remaining = task.lease_remaining(now=db_now)
        # An expired lease whose row a transaction locks is held, not abandoned (see TaskQuerySet.held).
        held = remaining is not None and remaining < 0 and task.pk in held_ids(using, [task.pk])
        attempts = list(Attempt.objects.using(task._state.db).filter(task_id=task.pk)
                        .order_by("started_at", "id"))
        steps = list(Step.objects.using(task._state.db).filter(task_id=task.pk).order_by("id"))
        if as_json:
            document = {
                "database": using,
                "db_now": db_now,
                "task": task_as_dict(task, remaining, held),
                "result_id": task_id(task._state.db or using, task.pk),
                "result_status": RESULT_STATUS[task.status] if task.task_path else None,
                "attempts": [{**a.as_dict(), "seconds": seconds_between(a)} for a in attempts],
                "steps": [step_as_dict(step) for step in steps],
            }
            self.write_json(document)
            return
        self.write_text(task, remaining, held, attempts, steps)

    @staticmethod
    def named_by_id(text: str, key: str | None, database: str | None) -> tuple[str, str, str]:
        """The key, tenant and database of the task that id ``text`` names (``parse_task_id``)."""
        if key is not None:
            raise CommandError("give either a key or --id, not both", returncode=USAGE_ERROR)
        try:
            using, pk = parse_task_id(text, using=database)
        except ValueError as exc:
            raise CommandError(str(exc), returncode=USAGE_ERROR) from exc
        if database is not None and using != database:
            raise CommandError(f"--id {text!r} names database {using!r}, not --database {database!r}",
                               returncode=USAGE_ERROR)
        with reading(using):
            found = Task.objects.db_manager(using).filter(pk=pk).values_list("key", "tenant").first()
        if found is None:
            raise CommandError(f"no task {using}:{pk} (id {text!r})", returncode=NOT_FOUND)
        return found[0], found[1], using

    def write_text(self, task: Task, remaining: float | None, held: bool, attempts: list[Attempt],
                   steps: list[Step]) -> None:
        out = self.stdout.write
        where = f" database={task._state.db}" if routing.several() else ""
        out(f"task {task.key!r} tenant={task.tenant!r} id={task.pk}{where}")
        lease = ""
        if remaining is not None and remaining >= 0:
            lease = f" (lease {remaining:.1f}s left)"
        elif remaining is not None and held:
            lease = f" (held: lease expired {-remaining:.1f}s ago, but {HELD_REASON})"
        elif remaining is not None:
            lease = f" (lease expired {-remaining:.1f}s ago)"
        rows: list[tuple[str, Any]] = [
            ("status", f"{task.status}{lease}"),
            *([("Django status", result_status(task))] if task.task_path else []),
            ("owner", task.owner or "-"),
            ("fencing token", task.fencing_token),
            ("attempts", f"{task.attempts}/{task.max_attempts}"),
            ("lease expires", task.lease_expires_at.isoformat() if task.lease_expires_at else "-"),
            ("payload", "-" if task.payload is None else json.dumps(task.payload)),
            ("result", "-" if task.result is None else json.dumps(task.result)),
            ("result ref", task.result_ref or "-"),
            ("error", task.error or "-"),
            ("queue", "- (claimed by key)" if task.queue is None else
             f"{task.queue} priority={task.priority} path={task.task_path or '(a handler)'}"),
            ("not before", task.run_after.isoformat() if task.run_after else "-"),
            ("progress", progress_text(task)),
            ("created", task.created_at.isoformat()),
            ("updated", task.updated_at.isoformat()),
        ]
        for label, value in rows:
            out(f"  {label:<14}{value}")
        out(f"attempts ({len(attempts)}):")
        if not attempts:
            out("  (none recorded)")
        for a in attempts:
            took = seconds_between(a)
            span = f"{took:.3f}s" if took is not None else "open"
            token = "-" if a.token is None else str(a.token)
            extras = []
            if a.delivery_id:
                extras.append(f"delivery={a.delivery_id}")
            if a.stale_writes:
                extras.append(f"fenced-off writes={a.stale_writes}")
            out(f"  token {token:>4}  {a.started_at.isoformat()}  {span:>10}  {a.outcome:<10}  "
                f"owner={a.owner!r} {' '.join(extras)}".rstrip())
        if steps:
            out(f"steps ({len(steps)}, stored results):")
        for step in steps:
            result = json.dumps(step.result, ensure_ascii=False)
            result = result if len(result) <= 80 else result[:79] + "…"
            out(f"  token {step.token:>4}  {step.created_at.isoformat()}  {step.name!r}  {result}")

    def write_queues(self, stats: list[dict[str, Any]], as_json: bool) -> None:
        if as_json:
            self.write_json({"queues": stats, **({"unreachable": self.unreachable} if self.unreachable else {})})
            return
        out = self.stdout.write
        if not stats:
            out("no queued task is pending or running")
            return
        several = routing.several()
        out(f"{'queue':<24}{'due':>8}{'deferred':>10}{'running':>9}  oldest due" + ("  database" if several else ""))
        for q in stats:
            age = "-" if q["oldest_due_age"] is None else f"{q['oldest_due_age']:.1f}s"
            line = f"{q['queue']:<24}{q['due']:>8}{q['deferred']:>10}{q['running']:>9}  {age}"
            out(f"{line:<63}  {q['database']}" if several else line)


__all__ = ["Command"]
