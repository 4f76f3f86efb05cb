"""Settings for the test suite.

The database is chosen by ``TASKCLAIM_TEST_DB`` (``sqlite`` by default, ``postgresql`` or ``mariadb``),
never by whichever driver happens to import. PostgreSQL is reached through the libpq
variables ``PGHOST``, ``PGPORT``, ``PGUSER``, ``PGPASSWORD``, ``PGDATABASE``. Worker
processes started by the tests set ``TASKCLAIM_TEST_DB_NAME`` to the test database's name.
"""

import importlib.util
import json
import os
import tempfile
from typing import Any

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
elif DB_VENDOR == "mariadb":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": _NAME_OVERRIDE or os.environ.get("MYSQL_DATABASE", "taskclaim"),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_TCP_PORT", "3306"),
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PWD", ""),
            "OPTIONS": {"charset": "utf8mb4"},
            "TEST": {"NAME": os.environ.get("TASKCLAIM_TEST_MYSQL_NAME", "test_taskclaim"),
                     "CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"},
        }
    }
else:
    raise RuntimeError(f"TASKCLAIM_TEST_DB must be 'sqlite', 'postgresql' or 'mariadb', not {DB_VENDOR!r}")

# ---- The configuration matrix (tests/configurations.py; docs/configurations.md) -------------
# TASKCLAIM_TEST_CONFIG names one supported Django setup; worker processes inherit it.
TEST_CONFIG = os.environ.get("TASKCLAIM_TEST_CONFIG", "default")
_default: dict[str, Any] = DATABASES["default"]
if "TASKCLAIM_TEST_POLL_INTERVAL" in os.environ:  # a worker process that must not find work by polling
    TASKCLAIM_POLL_INTERVAL = float(os.environ["TASKCLAIM_TEST_POLL_INTERVAL"])
if "TASKCLAIM_TEST_PREPARED" in os.environ:  # "0" or "1": a test's child process, either way
    TASKCLAIM_PREPARED_STATEMENTS = os.environ["TASKCLAIM_TEST_PREPARED"] == "1"
if TEST_CONFIG == "pool":
    # Django's connection pool (5.1+, psycopg-pool): every connection.close() hands the session
    # back, and the next query may run on another one.
    _default["OPTIONS"] = {"pool": {"min_size": 2, "max_size": 6, "timeout": 60}}
elif TEST_CONFIG == "server_side_binding":
    _default["OPTIONS"] = {"server_side_binding": True}
elif TEST_CONFIG == "pgbouncer":
    # A PgBouncer in transaction pool mode in front of the test server (started by the runner),
    # with the settings docs/configurations.md asks for.
    _default["PORT"] = os.environ.get("TASKCLAIM_TEST_PGBOUNCER_PORT", "6432")
    _default["DISABLE_SERVER_SIDE_CURSORS"] = True
    TASKCLAIM_PREPARED_STATEMENTS = os.environ.get("TASKCLAIM_TEST_PREPARED") == "1"  # "1": to see it fail
elif TEST_CONFIG == "atomic_requests":
    _default["ATOMIC_REQUESTS"] = True
elif TEST_CONFIG == "second_db":
    # The task table (and the effects fenced() writes with it) in "tasks"; everything else in
    # "default". Worker processes get the test database's name in TASKCLAIM_TEST_TASKS_DB_NAME.
    _tasks: dict[str, Any] = {**_default, "OPTIONS": dict(_default.get("OPTIONS", {})), "TEST": dict(_default["TEST"])}
    if DB_VENDOR == "sqlite":
        _tasks["NAME"] = _path + ".tasks"
        _tasks["TEST"]["NAME"] = _path + ".tasks.test"
    else:
        _tasks["TEST"]["NAME"] = _default["TEST"]["NAME"] + "_tasks"
    _tasks["NAME"] = os.environ.get("TASKCLAIM_TEST_TASKS_DB_NAME") or _tasks["NAME"]
    DATABASES["tasks"] = _tasks
    DATABASE_ROUTERS = ["tests.routers.TaskDatabaseRouter"]
    TASKCLAIM_DATABASE = "tasks"
elif TEST_CONFIG in ("sharded", "sharded_mixed"):
    # Tenants routed over two task databases: "default" (PostgreSQL, or SQLite in sharded_mixed) and
    # "shard2", a PostgreSQL server of its own that the runner starts (TASKCLAIM_TEST_SHARD_SERVER).
    # Worker processes get the test database's name in TASKCLAIM_TEST_SHARD_DB_NAME.
    import json as _json

    _shard = _json.loads(os.environ.get("TASKCLAIM_TEST_SHARD_SERVER") or '{"port": 5433}')
    DATABASES["shard2"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("TASKCLAIM_TEST_SHARD_DB_NAME", "postgres"),
        "HOST": "127.0.0.1",
        "PORT": str(_shard["port"]),
        "USER": "postgres",
        "PASSWORD": "",
        "TEST": {"NAME": "test_taskclaim_shard2"},
    }
    TASKCLAIM_DATABASES = ["default", "shard2"]
    TASKCLAIM_ROUTER = "tests.routers.tenant_database"
    DATABASE_ROUTERS = ["tests.routers.ShardRouter"]
elif TEST_CONFIG not in ("default", "autocommit_off"):
    raise RuntimeError(f"unknown TASKCLAIM_TEST_CONFIG {TEST_CONFIG!r}")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_results",
    "django_taskclaim",
    "django_taskclaim.downstream",
    "tests.testapp",
]
# Django's Tasks framework: built in from Django 6.0, the django_tasks backport (an app) before.
if importlib.util.find_spec("django.tasks") is None:
    INSTALLED_APPS.append("django_tasks")

TASKS = {
    "default": {
        "BACKEND": "django_taskclaim.tasks.ClaimBackend",
        "QUEUES": ["default", "emails"],
        # Retries come back within a test's patience.
        "OPTIONS": {"BACKOFF": {"base": 0.05, "cap": 0.2}},
    },
}

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

# ---- Celery bridge (tests/programs/celery_app.py reads these with namespace="CELERY") ----------------
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

# Schedules for the processes that tests start (taskclaim_scheduler): JSON in an environment variable.
TASKCLAIM_SCHEDULES = json.loads(os.environ.get("TASKCLAIM_TEST_SCHEDULES") or "{}")

# Any other settings of a process that a test starts: a JSON object of setting names and values
# (a bad TASKCLAIM_* value, to see a worker refuse it).
globals().update(json.loads(os.environ.get("TASKCLAIM_TEST_SETTINGS") or "{}"))
