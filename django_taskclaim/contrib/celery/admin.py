"""The Celery bridge's addition to the task admin: with django-celery-results installed, an
attempt's delivery id (the Celery task id) links to the stored ``TaskResult``.

Registered through ``contrib.INTEGRATIONS`` (``delivery_link``); imports neither Celery nor the
admin, so the admin loads it whether or not the extra is installed.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.db import router
from django.db.models import OuterRef, QuerySet, Subquery
from django.urls import NoReverseMatch, reverse
from django.utils.http import urlencode

#: django-celery-results (optional): attempts link to the stored result of their delivery.
RESULT_MODEL = ("django_celery_results", "TaskResult")


def celery_result_model() -> Any:
    """django-celery-results' ``TaskResult`` when that app is installed, else ``None``."""
    if not apps.is_installed(RESULT_MODEL[0]):
        return None
    try:
        return apps.get_model(*RESULT_MODEL)
    except LookupError:
        return None


class ResultLink:
    """Links an attempt's delivery id to django-celery-results' stored result of that delivery."""

    def annotate(self, attempts: QuerySet[Any]) -> QuerySet[Any]:
        """The stored result's primary key beside each attempt: one subquery instead of a lookup
        per row, only where both tables share a database."""
        result_model = celery_result_model()
        if result_model is not None and router.db_for_read(result_model) == attempts.db:
            attempts = attempts.annotate(celery_result_pk=Subquery(
                result_model.objects.filter(task_id=OuterRef("delivery_id")).values("pk")[:1]))
        return attempts

    def url(self, attempt: Any) -> str | None:
        """The stored result's page (or a search for the id, when none is stored yet); ``None``
        without django-celery-results in this admin site."""
        if celery_result_model() is None:
            return None
        pk = getattr(attempt, "celery_result_pk", None)
        try:
            if pk is not None:
                return reverse("admin:django_celery_results_taskresult_change", args=[pk])
            return (reverse("admin:django_celery_results_taskresult_changelist") + "?"
                    + urlencode({"q": attempt.delivery_id}))
        except NoReverseMatch:  # the results app is installed but not in this admin site
            return None


RESULT_LINK = ResultLink()
