"""Django settings for the benchmark processes.

The database comes from ``TASKCLAIM_BENCH_URL`` (set by ``python -m benchmarks``). The peer
django-tasks-db is installed as an app only when it can be imported (the ``bench`` extra).
"""

import importlib.util
import os
from urllib.parse import unquote, urlsplit

SECRET_KEY = "benchmarks-only-not-secret"  # noqa: S105
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_url = urlsplit(os.environ.get("TASKCLAIM_BENCH_URL", "postgresql://postgres@127.0.0.1:5432/taskclaim_bench"))
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(_url.path.lstrip("/")) or "taskclaim_bench",
        "HOST": _url.hostname or "127.0.0.1",
        "PORT": str(_url.port or 5432),
        "USER": unquote(_url.username or "postgres"),
        "PASSWORD": unquote(_url.password or ""),
        # Persistent connections for every Django-based system (ours and django-tasks-db): the
        # peers are compared at their best configuration, not at a new connection per request.
        "CONN_MAX_AGE": None,
    }
}

INSTALLED_APPS = ["django_taskclaim"]

HAVE_DJANGO_TASKS_DB = (
    importlib.util.find_spec("django_tasks_db") is not None
    and (importlib.util.find_spec("django.tasks") is not None
         or importlib.util.find_spec("django_tasks") is not None)
)
if HAVE_DJANGO_TASKS_DB:
    if importlib.util.find_spec("django.tasks") is None:
        INSTALLED_APPS.append("django_tasks")
    INSTALLED_APPS.append("django_tasks_db")
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "loggers": {
        "django_taskclaim": {"handlers": ["null"], "level": "WARNING", "propagate": False},
        "django_tasks_db": {"handlers": ["null"], "level": "WARNING", "propagate": False},
        "django_tasks": {"handlers": ["null"], "level": "WARNING", "propagate": False},
        "django.tasks": {"handlers": ["null"], "level": "WARNING", "propagate": False},
    },
}
