"""Integrations with brokers and agent frameworks (optional extras), one folder or module each.

``INTEGRATIONS`` is their registry: the name of each under ``contrib/`` -> the dotted path of its
system check function (``None`` where it has none). The app registers those checks when it is
ready; a check imports its framework only when it runs, and answers nothing where the extra is
not installed. Adding an integration is its folder and one line here.
"""

from __future__ import annotations

from django.core import checks
from django.utils.module_loading import import_string

INTEGRATIONS: dict[str, str | None] = {
    "celery": "django_taskclaim.contrib.celery.checks.check_celery",
    "langgraph": None,
}


def register_checks() -> None:
    """Register the system check of every integration in ``INTEGRATIONS`` that has one."""
    for path in INTEGRATIONS.values():
        if path is not None:
            checks.register(import_string(path))
