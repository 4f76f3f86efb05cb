"""``manage.py taskclaim_audit``: did any task run twice at once? Exit code 1 if so.

It reads the ``Attempt`` audit trail and reports:

- overlapping executions: two claims of one task whose ``[started_at, ended_at or now]``
  intervals overlap. The fencing design makes this impossible; finding one means a bug or a
  row written by hand, so the command exits 1 and can run in monitoring;
- takeovers (a lease expired and another worker claimed the task);
- fenced-off writes (writes refused because the writer no longer owned the task);
- duplicate deliveries (a claim that found the task running or done and did not execute it).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db.models import Count, DateTimeField, Exists, F, OuterRef, Subquery, Sum
from django.db.models.functions import Coalesce

from django_taskclaim import routing
from django_taskclaim.exceptions import TaskClaimError
from django_taskclaim.management.arguments import positive_int, since_value, tenant_name
from django_taskclaim.management.base import USAGE_ERROR, TaskClaimCommand, database_now
from django_taskclaim.models import Attempt
from django_taskclaim.store import DbNow

OVERLAP_FOUND = 1


def attempt_end() -> Coalesce:
    """When a claim stopped owning its task; an open one is measured up to the database's now."""
    return Coalesce("ended_at", DbNow(), output_field=DateTimeField())


class Command(TaskClaimCommand):
    verbosity = 1
    help = (
        "Audit the attempt history for overlapping executions of one task, takeovers, fenced-off "
        "writes and duplicate deliveries. Exits 1 when two executions of a task overlapped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", type=since_value, default=None, metavar="DURATION|ISO",
                            help="Only attempts active since then: a duration before now (30d, "
                                 "12h, 15m, 90s) or an ISO date/time (default: %(default)r, all).")
        parser.add_argument("--tenant", type=tenant_name, default=None,
                            help="Only this tenant's tasks (default: %(default)r, all tenants).")
        parser.add_argument("--limit", type=positive_int, default=50,
                            help="Items listed per section; counts are always complete "
                                 "(default: %(default)r).")
        self.add_database_argument(parser)
        self.add_json_argument(parser)

    def handle(self, *args: Any, since: timedelta | datetime | None, tenant: str | None,
               limit: int, as_json: bool, verbosity: int = 1, database: str | None = None,
               **options: Any) -> None:
        self.verbosity = verbosity
        # A tenant's tasks are in its database; else every task database (or the one named).
        try:
            aliases = (routing.route(tenant, database),) if tenant is not None else routing.databases(database)
        except TaskClaimError as exc:  # --database that does not hold the tenant's tasks
            raise CommandError(str(exc), returncode=USAGE_ERROR) from exc

        def audit(alias: str) -> dict[str, Any]:
            # A duration counts back from the database's clock, which stamped the attempts.
            cutoff = database_now(alias) - since if isinstance(since, timedelta) else since
            return self.audit(alias, cutoff, tenant, limit)

        reports = self.each_database(aliases, audit)
        if not reports:
            self.fail_if_unreachable("nothing was audited")
        report = self.merged(reports, limit)
        if self.unreachable:
            report["unreachable"] = self.unreachable
        if as_json:
            self.write_json(report)
        else:
            self.write_text(report)
        found = report["overlaps"]["count"]
        if found:  # an overlap is the graver finding: exit 1 even when a database was out of reach
            raise CommandError(
                f"{found} overlapping execution(s) found: one task ran twice at the same time",
                returncode=OVERLAP_FOUND)
        self.fail_if_unreachable("the others were audited")

    # -- the queries ----------------------------------------------------------------------
    def audit(self, using: str, cutoff: datetime | None, tenant: str | None, limit: int) -> dict[str, Any]:
        """The report of task database ``using``."""
        attempts = Attempt.objects.using(using).all()
        if tenant is not None:
            attempts = attempts.filter(task__tenant=tenant)
        claims = attempts.filter(token__isnull=False).annotate(end=attempt_end())
        if cutoff is not None:
            claims = claims.filter(end__gte=cutoff)
        return {
            "since": cutoff,
            "tenant": tenant,
            "databases": [using],
            "overlaps": self.overlaps(claims, cutoff, limit),
            "takeovers": self.takeovers(claims, limit),
            "stale_writes": self.stale_writes(claims, limit),
            "duplicates": self.duplicates(attempts, cutoff, limit),
        }

    @staticmethod
    def merged(reports: list[dict[str, Any]], limit: int) -> dict[str, Any]:
        """One report of several databases' reports: counts added up, items (each naming its
        database) listed database by database, ``limit`` per section."""
        if len(reports) == 1 and not routing.several():
            return reports[0]
        merged: dict[str, Any] = {"since": reports[0]["since"], "tenant": reports[0]["tenant"],
                                  "databases": [r["databases"][0] for r in reports]}
        for section in ("overlaps", "takeovers", "stale_writes", "duplicates"):
            parts = [r[section] for r in reports]
            merged[section] = {name: sum(p[name] for p in parts) for name in parts[0] if name != "items"}
            merged[section]["items"] = [{**item, "database": r["databases"][0]} for r in reports
                                        for item in r[section]["items"]][:limit]
        return merged

    def overlaps(self, claims: Any, cutoff: datetime | None, limit: int) -> dict[str, Any]:
        # Claims of one task take increasing tokens, so each overlapping pair is found once:
        # from the later claim (larger token), looking back at the earlier ones.
        earlier = (Attempt.objects.filter(task_id=OuterRef("task_id"), token__isnull=False,
                                          token__lt=OuterRef("token"))
                   .annotate(end=attempt_end())
                   .filter(end__gt=OuterRef("started_at"), started_at__lt=OuterRef("end")))
        if cutoff is not None:
            earlier = earlier.filter(end__gte=cutoff)
        later = claims.filter(Exists(earlier))
        items = []
        for b in later.select_related("task").order_by("started_at", "id")[:limit]:
            firsts = (Attempt.objects.using(claims.db).filter(task_id=b.task_id, token__isnull=False,
                                             token__lt=b.token)
                      .annotate(end=attempt_end())
                      .filter(end__gt=b.started_at, started_at__lt=b.end).order_by("token"))
            for a in firsts:
                items.append({"task_id": b.task_id, "key": b.task.key, "tenant": b.task.tenant,
                              "first": a.as_dict(), "second": b.as_dict()})
        return {"count": later.count(), "items": items}

    def takeovers(self, claims: Any, limit: int) -> dict[str, Any]:
        taker = Attempt.objects.filter(task_id=OuterRef("task_id"), token=OuterRef("token") + 1)
        taken = (claims.filter(outcome=Attempt.Outcome.TAKEN_OVER)
                 .annotate(taken_by=Subquery(taker.values("owner")[:1]),
                           key=F("task__key"), tenant=F("task__tenant")))
        items = [
            {"task_id": a.task_id, "key": a.key, "tenant": a.tenant, "token": a.token,
             "owner": a.owner, "at": a.ended_at, "taken_by": a.taken_by}
            for a in taken.order_by("-ended_at", "-id")[:limit]
        ]
        return {"count": taken.count(), "items": items}

    def stale_writes(self, claims: Any, limit: int) -> dict[str, Any]:
        refused = claims.filter(stale_writes__gt=0).annotate(key=F("task__key"),
                                                            tenant=F("task__tenant"))
        total = refused.aggregate(total=Sum("stale_writes"))["total"] or 0
        items = [
            {"task_id": a.task_id, "key": a.key, "tenant": a.tenant, "token": a.token,
             "owner": a.owner, "stale_writes": a.stale_writes, "outcome": a.outcome}
            for a in refused.order_by("-stale_writes", "id")[:limit]
        ]
        return {"count": total, "attempts": refused.count(), "items": items}

    def duplicates(self, attempts: Any, cutoff: datetime | None, limit: int) -> dict[str, Any]:
        dups = attempts.filter(outcome=Attempt.Outcome.DUPLICATE)
        if cutoff is not None:
            dups = dups.filter(started_at__gte=cutoff)
        per_task = (dups.values("task_id", "task__key", "task__tenant")
                    .annotate(n=Count("id")).order_by("-n", "task_id"))
        items = [{"task_id": row["task_id"], "key": row["task__key"],
                  "tenant": row["task__tenant"], "count": row["n"]} for row in per_task[:limit]]
        return {"count": dups.count(), "tasks": per_task.count(), "items": items}

    # -- output ---------------------------------------------------------------------------
    def write_text(self, report: dict[str, Any]) -> None:
        out = self.stdout.write
        overlaps, takeovers = report["overlaps"], report["takeovers"]
        stale, dups = report["stale_writes"], report["duplicates"]
        scope = []
        if routing.several():
            scope.append(f"database{'s' if len(report['databases']) > 1 else ''} {', '.join(report['databases'])}")
        if report["since"] is not None:
            scope.append(f"since {report['since'].isoformat()}")
        if report["tenant"] is not None:
            scope.append(f"tenant {report['tenant']!r}")
        out(f"taskclaim audit{' (' + ', '.join(scope) + ')' if scope else ''}")
        out(f"overlapping executions: {overlaps['count']}")
        for item in overlaps["items"]:
            a, b = item["first"], item["second"]
            out(f"  {self.name(item)}: token {a['token']} ({a['owner']}, {a['started_at']} -> "
                f"{a['ended_at'] or 'open'}) overlaps token {b['token']} ({b['owner']}, "
                f"{b['started_at']} -> {b['ended_at'] or 'open'})")
        out(f"takeovers: {takeovers['count']}")
        if self.verbosity >= 1:
            for item in takeovers["items"]:
                out(f"  {self.name(item)}: token {item['token']} of {item['owner']} taken over by "
                    f"{item['taken_by']} at {item['at'].isoformat() if item['at'] else '?'}")
        out(f"fenced-off writes: {stale['count']} (in {stale['attempts']} attempt(s))")
        if self.verbosity >= 1:
            for item in stale["items"]:
                out(f"  {self.name(item)}: token {item['token']} of {item['owner']}: "
                    f"{item['stale_writes']} refused")
        out(f"duplicate deliveries: {dups['count']} (in {dups['tasks']} task(s))")
        if self.verbosity >= 2:
            for item in dups["items"]:
                out(f"  {self.name(item)}: {item['count']}")
        out("result: OVERLAP FOUND" if overlaps["count"]
            else "result: ok, no overlapping executions")

    @staticmethod
    def name(item: dict[str, Any]) -> str:
        name = f"{item['tenant']}/{item['key']}" if item["tenant"] else repr(item["key"])
        return f"{name} (in {item['database']})" if "database" in item else name


__all__ = ["Command"]
