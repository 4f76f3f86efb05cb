"""The downstream's side of an effect beyond the database: a service that receives calls from tasks.

Add ``"django_taskclaim.downstream"`` to ``INSTALLED_APPS`` (it needs none of the task tables)
and decorate a view with :func:`fenced_endpoint`, or give a class-based view
:class:`FencedEndpointMixin`. The header contract it checks: docs/downstream.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["FencedEndpointMixin", "fenced_endpoint"]

if TYPE_CHECKING:
    from .endpoint import FencedEndpointMixin, fenced_endpoint


def __getattr__(name: str) -> Any:
    # Lazy, so that listing the app in INSTALLED_APPS does not import its models too early.
    if name in __all__:
        from . import endpoint

        return getattr(endpoint, name)
    raise AttributeError(f"module 'django_taskclaim.downstream' has no attribute {name!r}")
