"""The downstream's records in the admin, read-only: they change only with the calls they record."""

from __future__ import annotations

from django.contrib import admin

from ..readonly_admin import ReadOnlyAdmin
from .models import FencingMark, StoredResponse


@admin.register(FencingMark)
class FencingMarkAdmin(ReadOnlyAdmin):
    list_display = ("fencing_key", "token", "updated_at")
    search_fields = ("fencing_key",)


@admin.register(StoredResponse)
class StoredResponseAdmin(ReadOnlyAdmin):
    list_display = ("idempotency_key", "method", "path", "status_code", "body_stored", "fencing_token", "created_at")
    list_filter = ("status_code", "body_stored")
    search_fields = ("idempotency_key", "fencing_key", "path")
    exclude = ("body",)
    readonly_fields = ("body_preview",)

    @admin.display(description="body")
    def body_preview(self, obj: StoredResponse) -> str:
        body = bytes(obj.body)
        text = body[:2000].decode("utf-8", "replace")
        return text + ("…" if len(body) > 2000 else "")
