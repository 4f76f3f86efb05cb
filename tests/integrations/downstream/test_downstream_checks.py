"""The system checks of signed calls (E401, W402) and of ``fenced_endpoint`` without its app (E403)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import override_settings

from tests.conftest import ROOT


def checks():  # type: ignore[no-untyped-def]
    return importlib.import_module("django_taskclaim.downstream.checks")


@pytest.mark.parametrize(("value", "problem"), [
    ("", "an empty key"), ([], "an empty list"), (["k", ""], "an empty key"), (42, "type int"), (["k", 1], "type int"),
])
def test_e401_an_unusable_signing_key(value: object, problem: str) -> None:
    with override_settings(TASKCLAIM_SIGNING_KEY=value):
        (error,) = checks().check_signing_key()
    assert error.id == "django_taskclaim.E401" and problem in error.msg


@pytest.mark.parametrize("value", ["secret", b"secret", ["new", "old"], ("new", b"old")])
def test_a_usable_signing_key_passes(value: object) -> None:
    with override_settings(TASKCLAIM_SIGNING_KEY=value):
        assert checks().check_signing_key() == [] and checks().check_unsigned() == []


def test_w402_a_downstream_without_a_signing_key_believes_any_token() -> None:
    (warning,) = checks().check_unsigned()
    assert warning.id == "django_taskclaim.W402" and "forge" in warning.msg and "TASKCLAIM_SIGNING_KEY" in warning.hint


# A service that uses fenced_endpoint with the task app installed and the downstream's app not:
# its URLconf (a module of its own, imported by the checks) names a decorated view.
URLS = """
from django.http import JsonResponse
from django.urls import path

from django_taskclaim.downstream import fenced_endpoint


@fenced_endpoint
def charge(request):
    return JsonResponse({"ok": True}, status=201)


urlpatterns = [path("charge/", charge)]
"""
SERVICE = """
import django
from django.conf import settings

settings.configure(
    DEBUG=False, ALLOWED_HOSTS=["*"], ROOT_URLCONF="service_urls", SECRET_KEY="x", USE_TZ=True,
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_taskclaim"],
)
django.setup()
from django.core.management import call_command
from django.core.management.base import SystemCheckError
try:
    call_command("check")
except SystemCheckError as exc:
    print("refused:", exc)
else:
    print("passed")
"""


def test_e403_fenced_endpoint_without_its_app_fails_the_checks(tmp_path: Path) -> None:
    (tmp_path / "service_urls.py").write_text(URLS)
    done = subprocess.run([sys.executable, "-c", SERVICE], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT}:{tmp_path}"}, check=False)
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "django_taskclaim.E403" in done.stdout, done.stdout
