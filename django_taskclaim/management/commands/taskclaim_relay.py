"""``manage.py taskclaim_relay``: deliver the outbox's messages (see :mod:`django_taskclaim.relay`).

Run any number of relays: each message is claimed by one at a time, with a lease and a token.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_taskclaim import routing
from django_taskclaim.exceptions import InvalidArgument
from django_taskclaim.management.arguments import lease, positive_int, positive_seconds, task_database
from django_taskclaim.management.base import USAGE_ERROR, TaskClaimCommand
from django_taskclaim.relay import Relay
from django_taskclaim.stopping import Stop, stop_on_signals


class Command(TaskClaimCommand):
    help = (
        "Deliver the outbox's messages (recorded by claim.outbox.http() inside fenced()) with their "
        "Idempotency-Key and fencing headers; retry network errors, 5xx and a 409 for a call still in "
        "flight with backoff; record each answer. Stops on SIGTERM/SIGINT after the message in hand."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", type=task_database, default=None, metavar="ALIAS",
                            help="Only this task database's messages (default: every one of TASKCLAIM_DATABASES).")
        parser.add_argument("--lease", type=lease, default=60.0,
                            help="Seconds a relay holds a message it claimed; another relay sends it again "
                                 "after that (default: %(default)r).")
        parser.add_argument("--batch", type=positive_int, default=10,
                            help="Messages claimed at a time, at most (default: %(default)r).")
        parser.add_argument("--timeout", type=positive_seconds, default=10.0,
                            help="Seconds an HTTP request may take in all, connecting, sending and reading the "
                                 "whole answer (default: %(default)r).")
        parser.add_argument("--max-attempts", type=positive_int, default=10,
                            help="Deliveries of a message before a retryable answer fails it "
                                 "(default: %(default)r).")
        parser.add_argument("--backoff", type=positive_seconds, default=1.0,
                            help="Seconds before the first retry, doubled each time, at most 600 "
                                 "(default: %(default)r).")
        parser.add_argument("--until-drained", action="store_true",
                            help="Stop once no message is pending (none due, none under delivery elsewhere).")
        self.add_json_argument(parser)

    def handle(self, *args: Any, database: str | None, lease: float, batch: int, timeout: float,
               max_attempts: int, backoff: float, until_drained: bool, as_json: bool = False,
               **options: Any) -> None:
        stop = Stop()
        try:
            relay = Relay(routing.databases(database), lease=lease, batch=batch, timeout=timeout,
                          max_attempts=max_attempts, backoff=backoff, stop=stop)
        except InvalidArgument as exc:  # --timeout not shorter than --lease
            raise CommandError(f"--timeout/--lease: {exc}", returncode=USAGE_ERROR) from exc
        with stop_on_signals(stop):
            relay.run(until_drained=until_drained)
        counts = relay.counts
        if as_json:
            self.write_json(counts, indent=None)
        else:
            self.stdout.write(f"taskclaim_relay: {counts['delivered']} delivered, {counts['failed']} failed, "
                              f"{counts['retried']} to retry, {counts['lost']} lost to another relay")
