"""Differences between the supported Django versions."""

from __future__ import annotations

import django
from django.db import models
from django.db.models import Q


def check_constraint(*, condition: Q, name: str) -> models.CheckConstraint:
    """A ``CheckConstraint`` under the running Django's keyword (``check`` became ``condition`` in 5.1)."""
    keyword = "condition" if django.VERSION >= (5, 1) else "check"
    return models.CheckConstraint(name=name, **{keyword: condition})  # type: ignore[arg-type]
