"""How a claimed task finds its key and tenant from its arguments, and the registry of the
claimed tasks defined in this process (what the system checks look at)."""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings as django_settings

from ...conf import settings
from ...exceptions import InvalidTaskKey
from ...identity import TaskKey, resolve_identity
from .app import import_task_modules, project_app

ON_BUSY = ("retry", "skip", "wait")

KeySpec = str | TaskKey | Callable[..., "str | TaskKey"]


@dataclass(frozen=True)
class ClaimOptions:
    """How a claimed task finds its identity and what it does with a busy task."""

    key: KeySpec
    tenant: KeySpec
    lease: float | None
    on_busy: str
    max_attempts: int | None
    busy_countdown: float | None
    signature: inspect.Signature
    celery_options: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    @property
    def lease_seconds(self) -> float:
        # The raw default, unvalidated: the system checks read this, and E005 reports a bad one.
        return self.lease if self.lease is not None else settings.DEFAULT_LEASE

    def identity(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[str, str]:
        """The ``(key, tenant)`` of a call with these arguments."""
        key = self._resolve(self.key, "key", args, kwargs)
        tenant = self._resolve(self.tenant, "tenant", args, kwargs)
        return resolve_identity(key, tenant)

    def _resolve(self, spec: Any, what: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        if isinstance(spec, TaskKey):
            return spec
        if callable(spec):
            return spec(*args, **kwargs)
        if not isinstance(spec, str) or "{" not in spec:
            return spec
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidTaskKey(f"cannot build the {what} of {self.label}: {exc}") from exc
        bound.apply_defaults()
        try:
            return spec.format(*bound.args, **bound.arguments)
        except (KeyError, IndexError, AttributeError) as exc:
            raise InvalidTaskKey(
                f"{what} template {spec!r} of {self.label} does not fit the arguments: {exc!r}") from exc


def _check_template(spec: Any, what: str, signature: inspect.Signature, label: str) -> None:
    """Refuse at decoration time a format string that names no parameter of the task."""
    if not isinstance(spec, str) or "{" not in spec:
        return
    names = set(signature.parameters)
    positional = [p for p in signature.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    var_positional = any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values())
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(spec) if f is not None]
    except ValueError as exc:
        raise ValueError(f"{what} template {spec!r} of {label} is not a format string: {exc}") from None
    for name in fields:
        head = name.split(".", 1)[0].split("[", 1)[0]
        if head == "":
            raise ValueError(f"{what} template {spec!r} of {label}: use named or numbered fields, not {{}}")
        if head.isdigit():
            if int(head) >= len(positional) and not var_positional:
                raise ValueError(f"{what} template {spec!r} of {label}: there is no positional argument {head}")
        elif head not in names and not var_keyword:
            raise ValueError(
                f"{what} template {spec!r} of {label}: {head!r} is not a parameter "
                f"(parameters: {', '.join(names) or 'none'})"
            )


#: Every claimed task defined in this process: what the system checks look at.
_registry: dict[str, ClaimOptions] = {}


def register(label: str, options: ClaimOptions) -> None:
    """Record a claimed task defined in this process (``claimed_task`` calls it)."""
    _registry[label] = options


def claimed_tasks() -> list[ClaimOptions]:
    """Options of every claimed task defined (imported) in this process."""
    return list(_registry.values())


def in_use() -> bool:
    """Whether this project uses the bridge: a claimed task exists or an app is configured.

    A ``manage.py`` process has imported no task module yet (``autodiscover_tasks()`` waits
    for a worker to start), so with no claimed task seen so far, the project's Celery app is
    looked for and the modules its worker would import are imported. A module that fails to
    import counts as "in use": the system check then reports the error (E101).
    """
    if _registry or getattr(django_settings, "TASKCLAIM_CELERY_APP", None):
        return True
    app = project_app()
    if app is None:
        return False
    try:
        import_task_modules(app)
    except ImportError:
        return True
    return bool(_registry)
