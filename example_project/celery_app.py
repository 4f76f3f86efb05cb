"""The Celery app of the example project, used only by ``python3 -m example_project --celery``.

    celery -A example_project.celery_app worker --pool solo --prefetch-multiplier 1

Its settings are the ``CELERY_*`` names in :mod:`example_project.settings` (broker from
``REDIS_URL``, ``acks_late``, ``reject_on_worker_lost``, prefetch 1).
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

app = Celery("example_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["example_project.testgen"])
