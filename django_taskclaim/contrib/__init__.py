"""Integrations with brokers and agent frameworks (optional extras), one folder or module each.

``INTEGRATIONS`` is their registry: the name of each under ``contrib/`` -> what it plugs into
the app (an :class:`Integration`: dotted paths, imported only when used). The app registers the
checks when it is ready; a check imports its framework only when it runs, and answers nothing
where the extra is not installed. The admin asks :func:`delivery_links` for what links an
attempt's delivery id. Adding an integration is its folder and one line here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django.core import checks
from django.utils.module_loading import import_string


class Integration(NamedTuple):
    """What one integration plugs into the app, each the dotted path of an object in its folder."""

    #: Its system check function (registered when the app is ready).
    check: str | None = None
    #: What links an attempt's delivery id in the task admin: an object with
    #: ``annotate(attempts) -> attempts`` (one query for the page) and ``url(attempt) -> str | None``.
    delivery_link: str | None = None


INTEGRATIONS: dict[str, Integration] = {
    "celery": Integration(check="django_taskclaim.contrib.celery.checks.check_celery",
                          delivery_link="django_taskclaim.contrib.celery.admin.RESULT_LINK"),
    "langgraph": Integration(),
}


def register_checks() -> None:
    """Register the system check of every integration in ``INTEGRATIONS`` that has one."""
    for integration in INTEGRATIONS.values():
        if integration.check is not None:
            checks.register(import_string(integration.check))


def delivery_links() -> list[Any]:
    """The delivery links of the integrations that have one (see :attr:`Integration.delivery_link`)."""
    return [import_string(i.delivery_link) for i in INTEGRATIONS.values() if i.delivery_link is not None]
