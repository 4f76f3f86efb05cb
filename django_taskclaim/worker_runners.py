"""The runner a queue worker started without a handler uses: the one a plug-in registered.

``WORKER_RUNNERS`` is the registry, one line per plug-in that brings a runner: its name -> the
dotted path of a factory in the plug-in's folder, imported only when a worker asks for it.
``factory(*, backend, queues, lease, atomic)`` returns ``(runner, queues, lease)`` and raises
``InvalidArgument`` for what the command refuses as a usage error. ``taskclaim_worker`` names no
plug-in: it asks :func:`runner_without_handler`.
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

from .exceptions import InvalidArgument

WORKER_RUNNERS: dict[str, str] = {
    "django-tasks": "django_taskclaim.tasks.runner.worker_runner",  # the Django Tasks backend's tasks
}
#: The runner of ``taskclaim_worker`` with no handler.
DEFAULT = "django-tasks"


def runner_without_handler(name: str = DEFAULT, **options: Any) -> tuple[Any, list[str], float | None]:
    """The runner ``name`` (default :data:`DEFAULT`) made with ``options``: ``(runner, queues, lease)``."""
    try:
        factory = import_string(WORKER_RUNNERS[name])
    except Exception as exc:  # its framework is not installed (no Tasks framework): say so plainly
        raise InvalidArgument(f"no handler given, and the worker runner {name!r} cannot be used: {exc}") from exc
    return factory(**options)
