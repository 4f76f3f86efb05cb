"""A downstream service installs ``django_taskclaim.downstream`` without the task app or its tables."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

# A whole service in one script: settings without "django_taskclaim", migrated in memory, one view.
SERVICE = '''
import django
from django.conf import settings
from django.http import JsonResponse
from django.urls import path

settings.configure(
    DEBUG=False, ALLOWED_HOSTS=["*"], ROOT_URLCONF=__name__, SECRET_KEY="x",
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_taskclaim.downstream"],
)
django.setup()
from django.apps import apps
from django.core.management import call_command
from django.db import connection
from django.test import Client

from django_taskclaim.downstream import fenced_endpoint

runs = []

@fenced_endpoint
def charge(request):
    runs.append(1)
    return JsonResponse({"ok": True}, status=201)

urlpatterns = [path("charge/", charge)]
call_command("migrate", verbosity=0)
assert not apps.is_installed("django_taskclaim")
assert not [t for t in connection.introspection.table_names() if t.startswith("django_taskclaim_")]
headers = {"Idempotency-Key": "tc1-abc", "Taskclaim-Fencing-Key": "tc1-def", "Taskclaim-Fencing-Token": "2"}
assert Client().post("/charge/", b"{}", content_type="application/json", headers=headers).status_code == 201
assert Client().post("/charge/", b"{}", content_type="application/json", headers=headers).status_code == 201
headers["Taskclaim-Fencing-Token"] = "1"
headers["Idempotency-Key"] = "tc1-other"
assert Client().post("/charge/", b"{}", content_type="application/json", headers=headers).status_code == 409
assert runs == [1]
print("service ok")
'''


def test_a_service_runs_fenced_endpoint_without_the_task_app() -> None:
    done = subprocess.run([sys.executable, "-c", SERVICE], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "service ok"), done.stderr
