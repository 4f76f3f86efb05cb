"""Django settings for the child processes of the Django Tasks phase: one system per process.

``TASKCLAIM_BENCH_TASKS_SYSTEM`` names the system (a key of ``benchmarks.tasks_systems.SYSTEMS``)
and ``TASKCLAIM_BENCH_URL`` the database; ``TASKCLAIM_BENCH_SETTINGS`` (JSON), settings of one
step. The Tasks framework is Django's own ``django.tasks``
where it exists (Django 6+) and the ``django_tasks`` backport otherwise (Django 5.2).
"""

import importlib.util
import json
import os
from urllib.parse import unquote, urlsplit

from benchmarks.tasks_systems import QUEUE, SYSTEMS

SECRET_KEY = "benchmarks-only-not-secret"  # noqa: S105
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_system = SYSTEMS[os.environ["TASKCLAIM_BENCH_TASKS_SYSTEM"]]
_url = urlsplit(os.environ["TASKCLAIM_BENCH_URL"])
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(_url.path.lstrip("/")),
        "HOST": _url.hostname or "127.0.0.1",
        "PORT": str(_url.port or 5432),
        "USER": unquote(_url.username or "postgres"),
        "PASSWORD": unquote(_url.password or ""),
        # Persistent connections for every system, as each one's documentation recommends for workers.
        "CONN_MAX_AGE": None,
    }
}

_core_tasks = importlib.util.find_spec("django.tasks") is not None
INSTALLED_APPS = ([] if _core_tasks else ["django_tasks"]) + list(_system.apps)
TASKS = {"default": {"BACKEND": _system.backend, "QUEUES": [QUEUE]}}

if not os.environ.get("TASKCLAIM_BENCH_IDLE"):  # the latency phase runs every system at its defaults
    globals().update(dict(_system.settings))
# A step's own settings over those (the I/O-bound phase's worker holding tasks in flight).
globals().update(json.loads(os.environ.get("TASKCLAIM_BENCH_SETTINGS", "{}")))

# The same for every system: the framework's and the backends' loggers at WARNING, nowhere.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "loggers": {
        name: {"handlers": ["null"], "level": "WARNING", "propagate": False}
        for name in ("django.tasks", "django_tasks", "django_tasks_db", "django_ox", "oxpull", "django_taskclaim")
    },
}
