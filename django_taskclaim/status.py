"""The one vocabulary of task statuses and attempt outcomes, for models, SQL and commands alike."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class Status(models.TextChoices):
    """Where a task stands: ``Task.Status``."""

    PENDING = "pending", _("Pending")
    RUNNING = "running", _("Running")
    SUCCEEDED = "succeeded", _("Succeeded")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")


class Outcome(models.TextChoices):
    """How one attempt ended: ``Attempt.Outcome``."""

    RUNNING = "running", _("Running")
    SUCCEEDED = "succeeded", _("Succeeded")
    FAILED = "failed", _("Failed")
    RETRY = "retry", _("Failed, will retry")
    RELEASED = "released", _("Released")
    EXPIRED = "expired", _("Lease expired (reclaimed)")
    TAKEN_OVER = "taken_over", _("Lease expired (taken over)")
    CANCELLED = "cancelled", _("Cancelled")
    DUPLICATE = "duplicate", _("Duplicate delivery (not executed)")


class MessageStatus(models.TextChoices):
    """Where an outbox message stands (``OutboxMessage.Status``): waiting for (or under) delivery,
    delivered (a 2xx answer), or failed for good (a final answer, or its attempts used up)."""

    PENDING = "pending", _("Pending")
    DELIVERED = "delivered", _("Delivered")
    FAILED = "failed", _("Failed")


#: Statuses a task never leaves on its own (an operator may reset FAILED and CANCELLED).
TERMINAL: tuple[str, ...] = (Status.SUCCEEDED.value, Status.FAILED.value, Status.CANCELLED.value)
#: Statuses an operator's reset returns to PENDING.
RESETTABLE: tuple[str, ...] = (Status.FAILED.value, Status.CANCELLED.value)
#: Statuses a cancel moves to CANCELLED.
UNFINISHED: tuple[str, ...] = (Status.PENDING.value, Status.RUNNING.value)

#: The one mapping from these statuses to the words of Django's Tasks framework
#: (``TaskResultStatus``), which has no cancelled state: a CANCELLED task is reported FAILED,
#: its result's last error ``django_taskclaim.exceptions.TaskCancelled``.
RESULT_STATUS: dict[str, str] = {
    Status.PENDING.value: "READY",
    Status.RUNNING.value: "RUNNING",
    Status.SUCCEEDED.value: "SUCCESSFUL",
    Status.FAILED.value: "FAILED",
    Status.CANCELLED.value: "FAILED",
}


def reported_as(result_status: str) -> tuple[str, ...]:
    """The statuses that Django's Tasks framework reports as ``result_status`` (``"FAILED"``:
    failed and cancelled), by :data:`RESULT_STATUS`; ``ValueError`` for a word it does not use."""
    found = tuple(status for status, word in RESULT_STATUS.items() if word == str(result_status))
    if not found:
        raise ValueError(f"{str(result_status)!r} is not a status of Django's Tasks framework; it reports "
                         f"{', '.join(dict.fromkeys(RESULT_STATUS.values()))}")
    return found
