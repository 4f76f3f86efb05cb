"""Django's Tasks framework, wherever it is installed: ``django.tasks`` (Django 6.0+) or the
``django_tasks`` backport (Django 5.2). Nothing else in the package imports either.

The names are looked up at import time from whichever is present (typed ``Any``: the two
packages' classes are distinct types with the same shape).
"""

from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec
from typing import Any

from django.core.exceptions import ImproperlyConfigured

if find_spec("django.tasks") is not None:
    FRAMEWORK = "django.tasks"
    _where = {"base": "django.tasks.base", "backends": "django.tasks.backends.base",
              "exceptions": "django.tasks.exceptions", "signals": "django.tasks.signals",
              "json": "django.utils.json", "invalid": "InvalidTask"}
elif find_spec("django_tasks") is not None:
    FRAMEWORK = "django_tasks"
    _where = {"base": "django_tasks.base", "backends": "django_tasks.backends.base",
              "exceptions": "django_tasks.exceptions", "signals": "django_tasks.signals",
              "json": "django_tasks.utils", "invalid": "InvalidTaskError"}
else:  # pragma: no cover - the message is the point
    raise ImproperlyConfigured(
        "django_taskclaim.tasks needs Django's Tasks framework: Django 6.0 or newer (django.tasks), or "
        "the backport on Django 5.2 (pip install django-tasks, and 'django_tasks' in INSTALLED_APPS)"
    )

_framework, _base = import_module(FRAMEWORK), import_module(_where["base"])
_exceptions, _signals = import_module(_where["exceptions"]), import_module(_where["signals"])

DEFAULT_TASK_QUEUE_NAME: str = _framework.DEFAULT_TASK_QUEUE_NAME
task_backends: Any = _framework.task_backends
BaseTaskBackend: Any = import_module(_where["backends"]).BaseTaskBackend
Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
InvalidTask: Any = getattr(_exceptions, _where["invalid"])
TaskResultDoesNotExist: Any = _exceptions.TaskResultDoesNotExist
task_enqueued: Any = _signals.task_enqueued
task_started: Any = _signals.task_started
task_finished: Any = _signals.task_finished
normalize_json: Any = import_module(_where["json"]).normalize_json

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME", "FRAMEWORK", "BaseTaskBackend", "InvalidTask", "Task", "TaskContext", "TaskError",
    "TaskResult", "TaskResultDoesNotExist", "TaskResultStatus", "normalize_json", "task_backends", "task_enqueued",
    "task_finished", "task_started",
]
