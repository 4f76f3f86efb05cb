"""The id that names one task across the task databases: its primary key, after the alias of
its database when the tasks are spread over several (``"shard2:42"``). A Django task's result
id, and what operators (the admin, ``taskclaim_inspect --id``, the logs) call a task by."""

from __future__ import annotations

from .conf import settings
from .routing import several


def task_id(using: str, pk: int) -> str:
    """The id of task ``pk`` in database ``using``: ``"42"``, or ``"shard2:42"`` with several task
    databases (at most 64 characters: check E008 bounds the aliases)."""
    return f"{using}:{pk}" if several() else str(pk)


def parse_task_id(text: str, using: str | None = None) -> tuple[str, int]:
    """The database and primary key an id of :func:`task_id`'s form names; a bare primary key
    names one in ``using``, or in the only task database. ``ValueError`` saying why for any other."""
    alias, sep, pk = str(text).rpartition(":")
    if not pk.isdigit() or not pk.isascii():
        raise ValueError(f"{text!r} is not a task id (nor a result id): its primary key, or alias:pk")
    if sep:
        if alias not in settings.DATABASES:
            raise ValueError(f"{text!r} names no task database (a task id is its primary key, or 'alias:pk'); "
                             f"TASKCLAIM_DATABASES lists {', '.join(map(repr, settings.DATABASES))}")
        return alias, int(pk)
    if using is not None:
        return using, int(pk)
    if several():
        raise ValueError(f"{text!r} names no task database: with several task databases a task id is "
                         f"alias:pk ({', '.join(f'{a}:{pk}' for a in settings.DATABASES)}): 'alias:pk'")
    return settings.DATABASE, int(pk)
