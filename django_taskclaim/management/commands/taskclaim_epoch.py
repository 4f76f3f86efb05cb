"""``manage.py taskclaim_epoch``: the store's epoch, which every fencing token carries (DESIGN §13);
``--bump`` raises it, for a failover tool's callback after a promotion (Patroni's ``on_role_change``)
and on MySQL/MariaDB, which have no timeline to follow."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_taskclaim import routing
from django_taskclaim.exceptions import TaskClaimError
from django_taskclaim.lifecycle import transitions
from django_taskclaim.management.base import TaskClaimCommand
from django_taskclaim.store.epochs import EpochState


def as_dict(state: EpochState) -> dict[str, int]:
    return {"epoch": state.epoch, "timeline": state.timeline, "bumps": state.bumps,
            "first_token": state.floor + 1, "last_token": state.last_token}


class Command(TaskClaimCommand):
    help = (
        "Print each task database's epoch: every fencing token of a claim is above every token of "
        "an earlier epoch. --bump raises it by one: run it on the new primary after a promotion "
        "(a failover tool's callback); PostgreSQL also follows its timeline on its own."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--bump", action="store_true",
                            help="Raise the epoch by one (on the primary; after a promotion).")
        self.add_database_argument(parser)
        self.add_json_argument(parser)

    def handle(self, *args: Any, bump: bool, as_json: bool = False, database: str | None = None,
               **options: Any) -> None:
        reports = self.each_database(routing.databases(database), lambda alias: self.visit(alias, bump))
        if not reports:
            self.fail_if_unreachable("no epoch was read" if not bump else "no epoch was bumped")
        if as_json:
            document: dict[str, Any] = {"databases": {r["database"]: r for r in reports}}
            if self.unreachable:
                document["unreachable"] = self.unreachable
            self.write_json(document, indent=None)
        else:
            for r in reports:
                where = f"database {r['database']!r}: "
                timeline = f", timeline {r['timeline']}" if r["timeline"] else ""
                was = f" (was {r['before']['epoch']})" if bump else ""
                self.stdout.write(f"{where}epoch {r['epoch']}{was}{timeline}, {r['bumps']} bump(s); "
                                  f"tokens from {r['first_token']}")
        self.fail_if_unreachable("the others were bumped" if bump else "the others were read")

    @staticmethod
    def visit(alias: str, bump: bool) -> dict[str, Any]:
        try:
            if bump:
                before, after = transitions.bump_epoch(alias)
                return {"database": alias, **as_dict(after), "before": as_dict(before)}
            return {"database": alias, **as_dict(transitions.read_epoch(alias))}
        except TaskClaimError as exc:
            raise CommandError(str(exc)) from exc
