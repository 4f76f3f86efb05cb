"""django-taskclaim: one logical task, one worker, one effect."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("django-taskclaim")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"

__all__ = ["TaskKey", "arun_once", "run_once"]

if TYPE_CHECKING:
    from .identity import TaskKey
    from .once import arun_once, run_once


def __getattr__(name: str) -> Any:
    # Lazy, so that importing the package does not import models before apps are ready.
    if name == "TaskKey":
        from .identity import TaskKey

        return TaskKey
    if name == "arun_once":
        from .once import arun_once

        return arun_once
    if name == "run_once":
        from .once import run_once

        return run_once
    raise AttributeError(f"module 'django_taskclaim' has no attribute {name!r}")
