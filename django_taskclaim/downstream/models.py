"""What a downstream service remembers of the calls it received: per task, the highest fencing
token seen; per idempotency key, the response it gave."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

#: The longest key a header may carry (the contract's keys have 68 characters).
MAX_KEY_LENGTH = 255
#: The longest HTTP method a call may use (a longer one is a 400, not a database error).
MAX_METHOD_LENGTH = 16


class FencingMark(models.Model):
    """The highest ``Taskclaim-Fencing-Token`` accepted for one ``Taskclaim-Fencing-Key``: a call
    with a lower token comes from an owner that has been replaced, and is refused."""

    fencing_key = models.CharField(_("fencing key"), max_length=MAX_KEY_LENGTH, unique=True)
    token = models.BigIntegerField(_("highest token"))
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("fencing mark")
        verbose_name_plural = _("fencing marks")

    def __str__(self) -> str:
        return f"{self.fencing_key} ≥ {self.token}"


class StoredResponse(models.Model):
    """The response given to the first call of an ``Idempotency-Key``, replayed to its repeats.

    ``fingerprint`` (SHA-256 of method, path and body) tells a repeat from another request that
    reuses the key. A body over the endpoint's bound is not kept (``body_stored`` False).
    """

    idempotency_key = models.CharField(_("idempotency key"), max_length=MAX_KEY_LENGTH, unique=True)
    fingerprint = models.CharField(_("request fingerprint"), max_length=64)
    method = models.CharField(_("method"), max_length=MAX_METHOD_LENGTH)
    path = models.TextField(_("path"))
    status_code = models.PositiveSmallIntegerField(_("status code"))
    content_type = models.CharField(_("content type"), max_length=255, blank=True)
    body = models.BinaryField(_("body"), blank=True)
    body_stored = models.BooleanField(_("body stored"), default=True)
    fencing_key = models.CharField(_("fencing key"), max_length=MAX_KEY_LENGTH, blank=True)
    fencing_token = models.BigIntegerField(_("fencing token"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        verbose_name = _("stored response")
        verbose_name_plural = _("stored responses")

    def __str__(self) -> str:
        return f"{self.idempotency_key}: {self.status_code}"
