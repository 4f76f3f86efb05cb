"""Test settings for the processes that prove a Django task backend's checks run in ``manage.py
check`` and stop ``taskclaim_worker`` (tests/integrations/django_tasks/test_django_tasks_checks.py).

The suite's settings, with a ``ClaimBackend`` whose ``OPTIONS`` it cannot use (a mistyped
``BACKOFF`` field: check E201) and, on Django 5.2, the ``django_tasks`` backport left out of
``INSTALLED_APPS`` (check W203), as a new project may have them.
"""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "django_tasks"]
TASKS = {
    "default": {
        "BACKEND": "django_taskclaim.tasks.ClaimBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"BACKOFF": {"bse": 2}},
    },
}
