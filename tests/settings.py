"""Settings for the test suite.

The database is chosen by ``TASKCLAIM_TEST_DB`` (``sqlite`` by default, or ``postgresql``),
never by whichever driver happens to import. PostgreSQL is reached through the libpq
variables ``PGHOST``, ``PGPORT``, ``PGUSER``, ``PGPASSWORD``, ``PGDATABASE``. Worker
processes started by the tests set ``TASKCLAIM_TEST_DB_NAME`` to the test database's name.
"""

import os
import tempfile

SECRET_KEY = "tests-only-not-secret"  # noqa: S105
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DB_VENDOR = os.environ.get("TASKCLAIM_TEST_DB", "sqlite")
_NAME_OVERRIDE = os.environ.get("TASKCLAIM_TEST_DB_NAME")

if DB_VENDOR == "sqlite":
    _path = os.environ.get(
        "TASKCLAIM_TEST_SQLITE", os.path.join(tempfile.gettempdir(), f"taskclaim-tests-{os.getuid()}.sqlite3")
    )
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": _NAME_OVERRIDE or _path,
            # Worker processes share the file: a file test database, and a generous busy timeout.
            "TEST": {"NAME": _path + ".test"},
            "OPTIONS": {"timeout": 60},
        }
    }
elif DB_VENDOR == "postgresql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _NAME_OVERRIDE or os.environ.get("PGDATABASE", "taskclaim"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "USER": os.environ.get("PGUSER", "postgres"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
            "TEST": {"NAME": os.environ.get("TASKCLAIM_TEST_PG_NAME", "test_taskclaim")},
        }
    }
else:
    raise RuntimeError(f"TASKCLAIM_TEST_DB must be 'sqlite' or 'postgresql', not {DB_VENDOR!r}")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_results",
    "django_taskclaim",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

STATIC_URL = "/static/"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "loggers": {"django_taskclaim": {"handlers": ["null"], "level": "INFO", "propagate": True}},
}

# ---- Celery bridge (tests/celery_app.py reads these with namespace="CELERY") ----------------
# The recommended settings of docs/celery.md. Worker processes started by the tests get the
# broker and a few knobs through the environment.
_REDIS_URL = os.environ.get("TASKCLAIM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = _REDIS_URL
CELERY_RESULT_BACKEND = _REDIS_URL.rsplit("/", 1)[0] + "/1"
CELERY_TASK_ACKS_LATE = os.environ.get("TASKCLAIM_TEST_ACKS_LATE", "1") == "1"
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": float(os.environ.get("TASKCLAIM_TEST_VISIBILITY_TIMEOUT", "3600")),
    # Look for expired unacknowledged messages every second (kombu's default is 10 s).
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
}
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
