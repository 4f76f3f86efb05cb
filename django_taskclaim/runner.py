"""Deprecated home of ``run_once``, ``run_once_with`` and ``run_claimed``: import them from
``django_taskclaim`` (``run_once``) or :mod:`django_taskclaim.once`."""

from __future__ import annotations

import warnings

from .once import run_claimed, run_once, run_once_with

warnings.warn("django_taskclaim.runner is deprecated: import from django_taskclaim.once", DeprecationWarning,
              stacklevel=2)

__all__ = ["run_claimed", "run_once", "run_once_with"]
