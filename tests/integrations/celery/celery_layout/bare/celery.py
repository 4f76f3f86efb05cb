"""The project's Celery app, as Celery's Django guide writes it."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bare.settings")

app = Celery("bare")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
