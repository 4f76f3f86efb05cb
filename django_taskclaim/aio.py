"""Deprecated home of ``arun_once`` and ``arun_claimed``: import them from ``django_taskclaim``
(``arun_once``) or :mod:`django_taskclaim.once`."""

from __future__ import annotations

import warnings

from .once import arun_claimed, arun_once

warnings.warn("django_taskclaim.aio is deprecated: import from django_taskclaim.once", DeprecationWarning,
              stacklevel=2)

__all__ = ["arun_claimed", "arun_once"]
