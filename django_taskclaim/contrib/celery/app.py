"""Finding the project's Celery app the way its worker does (for the system checks and requeue)."""

from __future__ import annotations

import importlib
import sys

from celery import Celery
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string, module_has_submodule


def celery_app() -> Celery:
    """The Celery app the bridge publishes with and the system checks inspect.

    ``TASKCLAIM_CELERY_APP`` (a dotted path such as ``"proj.celery.app"`` or
    ``"proj.celery:app"``) when set, else the project's app found as described in
    :func:`project_app`, else Celery's current (default) app.
    """
    path = getattr(django_settings, "TASKCLAIM_CELERY_APP", None)
    if not path:
        from celery import current_app

        return project_app() or current_app._get_current_object()
    if not isinstance(path, str):
        raise ImproperlyConfigured(f"TASKCLAIM_CELERY_APP must be a dotted path string, not {path!r}")
    try:
        app = import_string(path.replace(":", "."))
    except ImportError as exc:
        raise ImproperlyConfigured(f"TASKCLAIM_CELERY_APP = {path!r} cannot be imported: {exc}") from exc
    if not isinstance(app, Celery):
        raise ImproperlyConfigured(f"TASKCLAIM_CELERY_APP = {path!r} is a {type(app).__name__}, not a Celery app")
    return app


def project_app() -> Celery | None:
    """The Django project's own Celery app, found as a worker of the project would find it.

    In the layout of Celery's Django guide, ``proj/celery.py`` creates the app and
    ``proj/__init__.py`` imports it (``from .celery import app as celery_app``), so importing
    the settings module ``proj.settings`` made it Celery's current app. In that order:

    1. the current app, when the project created one (not Celery's stand-in default app);
    2. ``celery_app`` in the settings module's top package (the guide's name);
    3. what ``celery -A proj`` finds: ``proj.app``, ``proj.celery``, or the app in
       ``proj/celery.py`` (imported if ``proj/__init__.py`` did not).

    ``None`` when the project has no Celery app.
    """
    from celery import _state

    current = getattr(getattr(_state, "_tls", None), "current_app", None)
    if isinstance(current, Celery):
        return current
    module = getattr(django_settings, "SETTINGS_MODULE", None) or ""
    package = module.split(".", 1)[0]
    if not package or package == module:  # a top-level settings module has no project package
        return None
    top = sys.modules.get(package)
    found = getattr(top, "celery_app", None)
    if isinstance(found, Celery):
        return found
    from celery.app.utils import find_app

    try:
        app = find_app(package)
    except (ImportError, AttributeError):
        return None
    return app if isinstance(app, Celery) else None


def import_task_modules(app: Celery) -> None:
    """Import the modules a worker of ``app`` would: ``imports``, ``include``, each Django app's ``tasks``.

    The system checks need every claimed task defined; ``autodiscover_tasks()`` only imports
    them when a worker starts.
    """
    from django.apps import apps

    names = [*(app.conf.imports or ()), *(app.conf.include or ())]
    names += [f"{config.name}.tasks" for config in apps.get_app_configs()
              if config.module is not None and module_has_submodule(config.module, "tasks")]
    for name in names:
        importlib.import_module(name)
