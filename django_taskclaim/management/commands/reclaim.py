"""``manage.py reclaim``: the command's name in the design, the same command as
``taskclaim_reclaim`` (same options, output and exit codes), whose ``taskclaim_`` prefix it
shares with the app's other commands."""

from __future__ import annotations

from django_taskclaim.management.commands import taskclaim_reclaim


class Command(taskclaim_reclaim.Command):
    help = f"The same command as taskclaim_reclaim. {taskclaim_reclaim.Command.help}"


__all__ = ["Command"]
