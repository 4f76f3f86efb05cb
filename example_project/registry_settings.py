"""Settings of the second service, the artifact registry: the same project's code with its own
URLconf and its own SQLite file (``registry.sqlite3`` beside the demo's), no task tables.

It receives the suites the agents publish through the outbox (``claim.outbox.http``) and
checks their idempotency key and fencing token with ``fenced_endpoint`` (``django_taskclaim.downstream``).
"""

from __future__ import annotations

import os
from pathlib import Path

from example_project.dburl import sqlite_database

BASE_DIR = Path(__file__).resolve().parent
VAR_DIR = Path(os.environ.get("EXAMPLE_VAR_DIR") or BASE_DIR / "var")

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-project-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "example_project.registry.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {"default": sqlite_database(VAR_DIR / "registry.sqlite3")}

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django_taskclaim.downstream",  # the fencing marks and stored responses; no task tables
    "example_project.registry",
]
MIDDLEWARE = ["django.middleware.common.CommonMiddleware"]
# The secret both services share: the relays sign each call (Taskclaim-Signature) and the registry
# refuses a call not signed with it (401), so no one else can send a fencing token.
TASKCLAIM_SIGNING_KEY = os.environ.get("TASKCLAIM_SIGNING_KEY", "example-project-not-secret-signing")
