"""Settings shared by the two test projects: Celery with acks_late off and prefetch 4."""

import os
import tempfile

SECRET_KEY = "celery-layout-tests-only"  # noqa: S105
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django_taskclaim", "shop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(tempfile.gettempdir(), "taskclaim-celery-layout.sqlite3"),
        "OPTIONS": {"timeout": 30},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Nothing connects to the broker: the checks only read the configuration.
CELERY_BROKER_URL = "redis://127.0.0.1:9/0"
CELERY_TASK_ACKS_LATE = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 4
CELERY_TASK_REJECT_ON_WORKER_LOST = True
