"""The task table and its audit trail."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .compat import check_constraint
from .querysets import AttemptManager, TaskManager

if TYPE_CHECKING:
    from datetime import datetime


class Task(models.Model):
    """One logical unit of work, identified by ``(tenant, key)``, claimed by one worker at a time."""

    class Status(models.TextChoices):
        PENDING = "pending", _("Pending")
        RUNNING = "running", _("Running")
        SUCCEEDED = "succeeded", _("Succeeded")
        FAILED = "failed", _("Failed")
        CANCELLED = "cancelled", _("Cancelled")

    TERMINAL = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    id = models.BigAutoField(primary_key=True)
    tenant = models.CharField(_("tenant"), max_length=255, blank=True, default="")
    key = models.CharField(_("key"), max_length=255)
    status = models.CharField(_("status"), max_length=16, choices=Status.choices, default=Status.PENDING)
    owner = models.CharField(_("owner"), max_length=255, blank=True, default="")
    fencing_token = models.BigIntegerField(_("fencing token"), default=0)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    max_attempts = models.PositiveIntegerField(_("max attempts"), default=5)
    # Changes on every heartbeat: deliberately in no index, so renewals stay HOT updates.
    lease_expires_at = models.DateTimeField(_("lease expires at"), null=True, blank=True)
    payload = models.JSONField(_("payload"), null=True, blank=True)
    payload_fingerprint = models.CharField(_("payload fingerprint"), max_length=64, blank=True, default="")
    result = models.JSONField(_("result"), null=True, blank=True)
    result_ref = models.CharField(_("result reference"), max_length=1024, blank=True, default="")
    error = models.TextField(_("error"), blank=True, default="")
    # What the Celery bridge needs to publish the task again (name, args, kwargs, options).
    dispatch = models.JSONField(_("dispatch"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    updated_at = models.DateTimeField(_("updated at"), default=timezone.now)

    objects = TaskManager()

    class Meta:
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        ordering = ["-id"]
        permissions = [
            ("reclaim_task", "Can reclaim expired tasks"),
            ("release_task", "Can force-release a running task"),
            ("reset_task", "Can reset a failed or cancelled task"),
            ("cancel_task", "Can cancel a task"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key"], name="taskclaim_task_tenant_key_uniq"),
            check_constraint(
                name="taskclaim_task_status_valid",
                condition=Q(status__in=["pending", "running", "succeeded", "failed", "cancelled"]),
            ),
            check_constraint(name="taskclaim_task_token_nonnegative", condition=Q(fencing_token__gte=0)),
            check_constraint(
                name="taskclaim_task_running_has_lease",
                condition=~Q(status="running") | Q(lease_expires_at__isnull=False),
            ),
        ]
        indexes = [
            # Match the claim queries: the oldest pending first, and expired running ones.
            models.Index(fields=["id"], condition=Q(status="pending"), name="taskclaim_task_pending_idx"),
            models.Index(fields=["id"], condition=Q(status="running"), name="taskclaim_task_running_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.key}" if self.tenant else self.key

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

    def lease_remaining(self, now: datetime | None = None) -> float | None:
        """Seconds of lease left (negative once expired), by ``now`` or the local clock; display only."""
        if self.status != self.Status.RUNNING or self.lease_expires_at is None:
            return None
        return (self.lease_expires_at - (now or timezone.now())).total_seconds()


class Attempt(models.Model):
    """One claim of a task (or one delivery that found it taken): the audit trail."""

    class Outcome(models.TextChoices):
        RUNNING = "running", _("Running")
        SUCCEEDED = "succeeded", _("Succeeded")
        FAILED = "failed", _("Failed")
        RETRY = "retry", _("Failed, will retry")
        RELEASED = "released", _("Released")
        EXPIRED = "expired", _("Lease expired (reclaimed)")
        TAKEN_OVER = "taken_over", _("Lease expired (taken over)")
        CANCELLED = "cancelled", _("Cancelled")
        DUPLICATE = "duplicate", _("Duplicate delivery (not executed)")

    id = models.BigAutoField(primary_key=True)
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="attempt_set", verbose_name=_("task"))
    # NULL for duplicate deliveries, which never held a claim.
    token = models.BigIntegerField(_("fencing token"), null=True, blank=True)
    owner = models.CharField(_("owner"), max_length=255, blank=True, default="")
    delivery_id = models.CharField(_("delivery id"), max_length=255, blank=True, default="")
    started_at = models.DateTimeField(_("started at"), default=timezone.now)
    ended_at = models.DateTimeField(_("ended at"), null=True, blank=True)
    outcome = models.CharField(_("outcome"), max_length=16, choices=Outcome.choices, default=Outcome.RUNNING)
    stale_writes = models.PositiveIntegerField(_("fenced-off writes"), default=0)

    objects = AttemptManager()

    class Meta:
        verbose_name = _("attempt")
        verbose_name_plural = _("attempts")
        ordering = ["task_id", "started_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["task", "token"], name="taskclaim_attempt_task_token_uniq"),
        ]
        indexes = [models.Index(fields=["started_at"], name="taskclaim_attempt_started_idx")]

    def __str__(self) -> str:
        return f"{self.task_id}#{self.token} {self.outcome}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "owner": self.owner,
            "delivery_id": self.delivery_id,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "outcome": self.outcome,
            "stale_writes": self.stale_writes,
        }
