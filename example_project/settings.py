"""Settings of the example project.

The database comes from ``DATABASE_URL`` (PostgreSQL or SQLite, see :mod:`example_project.dburl`);
without it, a SQLite file under ``example_project/var/`` (WAL mode). ``EXAMPLE_VAR_DIR`` moves
the directory that holds the SQLite file and the generated artifacts.
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path

from example_project.dburl import parse_database_url

BASE_DIR = Path(__file__).resolve().parent
VAR_DIR = Path(os.environ.get("EXAMPLE_VAR_DIR") or BASE_DIR / "var")
# Where agents write the test suites they generate; a task's result_ref is relative to it.
ARTIFACT_DIR = VAR_DIR / "artifacts"

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-project-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True  # required with SQLite: leases are compared on the database's UTC clock
TIME_ZONE = "UTC"
ROOT_URLCONF = "example_project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": parse_database_url(os.environ.get("DATABASE_URL", ""), VAR_DIR / "demo.sqlite3")
}

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_taskclaim",
    "example_project.testgen",
]
# Django's Tasks framework (--worker): built into Django 6; on Django 5.2 the django_tasks backport,
# an app (the demo installs it: the [tasks] extra).
if find_spec("django.tasks") is None and find_spec("django_tasks") is not None:
    INSTALLED_APPS.append("django_tasks")

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

# django-taskclaim: an agent's lease (every claim of the example uses it). The demo shortens it,
# and the simulated generation below, through the environment of the agents it starts.
TASKCLAIM_DEFAULT_LEASE = float(os.environ.get("TESTGEN_LEASE", "30"))
TASKCLAIM_MAX_ATTEMPTS = 5
# The secret both services share: the relays sign each call (Taskclaim-Signature) and the registry
# refuses a call not signed with it (401), so no one else can send a fencing token.
TASKCLAIM_SIGNING_KEY = os.environ.get("TASKCLAIM_SIGNING_KEY", "example-project-not-secret-signing")

# Generating a suite is simulated: TESTGEN_STEPS tests written over TESTGEN_WORK_SECONDS.
TESTGEN_WORK_SECONDS = float(os.environ.get("TESTGEN_WORK_SECONDS", "1"))
TESTGEN_STEPS = int(os.environ.get("TESTGEN_STEPS", "4"))

# The second service the agents publish each suite to, through the outbox (testgen/agent.py):
# the artifact registry (example_project/registry/, its own settings and SQLite file). The demo
# starts it on a free port and sets this; by hand: `manage.py runserver 8001 --settings
# example_project.registry_settings`, and `manage.py taskclaim_relay` delivers the messages.
TESTGEN_REGISTRY_URL = os.environ.get("TESTGEN_REGISTRY_URL", "http://127.0.0.1:8001").rstrip("/")

# How a requested job reaches the agents: "demo" (the demo's simulated queue delivers it),
# "tasks" (the job API enqueues a Django task, run by taskclaim_worker) or "celery" (the job API
# publishes it with enqueue_once on commit).
TESTGEN_DISPATCH = os.environ.get("TESTGEN_DISPATCH", "demo")

# Django's Tasks framework on the task table: `manage.py taskclaim_worker --queue testgen` runs
# the jobs that the job API enqueues (example_project/testgen/jobs_tasks.py). The lease and the
# attempts are TASKCLAIM_DEFAULT_LEASE and TASKCLAIM_MAX_ATTEMPTS (OPTIONS LEASE, MAX_ATTEMPTS).
TASKS = {"default": {"BACKEND": "django_taskclaim.tasks.ClaimBackend", "QUEUES": ["testgen"]}}

# Only read with --celery (example_project.celery_app). The settings that keep a broker from
# losing work: acknowledge after the task, redeliver when a worker dies, prefetch one.
CELERY_BROKER_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # The demo shortens it to provoke redeliveries; they are harmless under a claim.
    "visibility_timeout": float(os.environ.get("TESTGEN_VISIBILITY_TIMEOUT", "3600")),
}
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("TESTGEN_QUEUE", "testgen")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
if TESTGEN_DISPATCH == "celery":
    TASKCLAIM_CELERY_APP = "example_project.celery_app.app"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_taskclaim": {"handlers": ["console"], "level": "ERROR"}},
}
