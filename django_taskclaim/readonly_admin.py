"""A model admin that only reads: the rows it shows change by the app's own guarded code, never by
a form (the task and outbox tables, the downstream's records)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest


class ReadOnlyAdmin(admin.ModelAdmin):
    """No add, change or delete: old rows go with ``taskclaim_purge``, and deleting a running task
    would hide it from the audit."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
