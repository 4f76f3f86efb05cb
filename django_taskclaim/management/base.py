"""What every taskclaim command shares: ``--json`` output (failures included) and the database clock."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections

from django_taskclaim import outages, routing
from django_taskclaim.conf import settings
from django_taskclaim.store import store_now

USAGE_ERROR = 2
#: Exit code when a task database could not be reached (the others were done).
UNREACHABLE = 3
T = TypeVar("T")


def database_now(using: str | None = None) -> datetime:
    """The database's clock (as the leases use it), never this process's clock."""
    return store_now(using or settings.DATABASE)


def dumps(document: Any, *, indent: int | None = None) -> str:
    return json.dumps(document, cls=DjangoJSONEncoder, indent=indent, ensure_ascii=False)


class TaskClaimCommand(BaseCommand):
    """A command with ``--json``: its report, and any failure, as JSON on stdout.

    A failure is ``{"error": "...", "returncode": N}`` on stdout (the message also goes to
    stderr as usual), unless the command already printed its JSON report (an audit that found
    overlaps prints the report and exits 1). Usage errors exit 2, from the command line and
    from ``call_command``.
    """

    json_requested = False
    json_written = False
    #: The task databases this run could not reach: alias -> the one-line message (``each_database``).
    unreachable: dict[str, str]

    def add_database_argument(self, parser: CommandParser) -> None:
        from django_taskclaim.management.arguments import task_database

        parser.add_argument("--database", type=task_database, default=None, metavar="ALIAS",
                            help="Only this task database (default: every one of TASKCLAIM_DATABASES).")

    def add_json_argument(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", dest="as_json",
                            help="Print JSON instead of text (failures too).")

    def run_from_argv(self, argv: list[str]) -> None:
        # The parser fails before execute() sees the options: decide from the raw arguments.
        self.json_requested = "--json" in argv[2:]
        super().run_from_argv(argv)

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        command = self

        def error(message: str) -> None:
            if parser.called_from_command_line:
                if command.json_requested:
                    sys.stdout.write(dumps({"error": message, "returncode": USAGE_ERROR}) + "\n")
                    sys.stdout.flush()
                parser.print_usage(sys.stderr)
                parser.exit(USAGE_ERROR, f"{parser.prog}: error: {message}\n")
            raise CommandError(f"Error: {message}", returncode=USAGE_ERROR)

        parser.error = error  # type: ignore[method-assign]
        return parser

    def each_database(self, aliases: Iterable[str], visit: Callable[[str], T]) -> list[T]:
        """``visit(alias)`` for each alias, in order: what each returned. One of several task
        databases that cannot be connected to is said on stderr (one line, naming it once) and noted
        in ``unreachable``, and the others go on; :meth:`fail_if_unreachable` ends the command with
        exit code 3 afterwards. Any other database error is raised as it is."""
        found = []
        for alias in aliases:
            try:
                found.append(visit(alias))
            except routing.UNREACHABLE as exc:
                if not routing.cannot_reach(alias):
                    raise  # one database, or a statement's own error: never swallowed
                self.unreachable[alias] = outages.describe(alias, exc)
                self.stderr.write(f"{self.command_name}: {self.unreachable[alias]}")
                connections[alias].close_if_unusable_or_obsolete()
        return found

    def fail_if_unreachable(self, done: str) -> None:
        """``CommandError`` (exit code 3) naming the databases ``each_database`` could not reach."""
        if self.unreachable:
            raise CommandError(f"task database(s) {', '.join(map(repr, self.unreachable))} could not be reached; "
                               f"{done}", returncode=UNREACHABLE)

    @property
    def command_name(self) -> str:
        return type(self).__module__.rsplit(".", 1)[-1]

    def execute(self, *args: Any, **options: Any) -> Any:
        self.json_written = False
        self.unreachable = {}
        try:
            return super().execute(*args, **options)
        except CommandError as exc:
            if options.get("as_json") and not self.json_written:
                self.stdout.write(dumps({"error": str(exc), "returncode": exc.returncode}))
            raise
        except Exception as exc:  # a database error, say: reported, then raised as it is
            if options.get("as_json") and not self.json_written:
                self.stdout.write(dumps({"error": f"{type(exc).__name__}: {exc}", "returncode": 1}))
            raise

    def write_json(self, document: Any, *, indent: int | None = 2) -> None:
        self.stdout.write(dumps(document, indent=indent))
        self.json_written = True


__all__ = ["UNREACHABLE", "USAGE_ERROR", "TaskClaimCommand", "database_now", "dumps"]
