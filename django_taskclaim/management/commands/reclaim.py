"""``manage.py reclaim``: the deprecated name of ``taskclaim_reclaim`` (same options, output and
exit codes), kept so that existing cron jobs and scripts keep working."""

from __future__ import annotations

import warnings
from typing import Any

from django_taskclaim.management.commands import taskclaim_reclaim

NOTICE = "manage.py reclaim is deprecated and will be removed: use manage.py taskclaim_reclaim (same options)"


class Command(taskclaim_reclaim.Command):
    help = f"Deprecated: use taskclaim_reclaim. {taskclaim_reclaim.Command.help}"

    def handle(self, *args: Any, **options: Any) -> None:
        # On stderr (the stream execute() set up, captured by call_command), so that --json
        # output on stdout stays one document.
        warnings.warn(NOTICE, DeprecationWarning, stacklevel=1)
        self.stderr.write(NOTICE)
        super().handle(*args, **options)


__all__ = ["Command"]
