"""The app's own system checks: the task databases' aliases and stores, the tenant router, and the
``TASKCLAIM_*`` settings.

Each database answers for itself (``store.system_check``: E001, then the store's own E002, E003,
E010, W020, W021…; ``store.server_check``, where Django asks for the database checks: E023),
each integration too (``contrib.INTEGRATIONS``: the Celery bridge's E101, W101–W106). Every ID
is declared with ``checkspec.spec``, which refuses one declared twice; docs/reference.md lists
them all.
"""

from __future__ import annotations

from difflib import get_close_matches
from importlib import import_module
from importlib.util import find_spec
from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from . import store
from .checkspec import spec
from .conf import KNOWN_SETTINGS, settings
from .downstream.checks import register_caller
from .exceptions import InvalidArgument, InvalidLease
from .retries import Backoff
from .values import LEASE_CEILING, MAX_INT, json_encoder, lease_seconds

E004 = spec("django_taskclaim.E004", "TASKCLAIM_DATABASE = {alias!r} is not in DATABASES.",
            "Set TASKCLAIM_DATABASE to one of: {aliases}.")
E005 = spec("django_taskclaim.E005", "{name} = {value!r} is invalid: {problem}.",
            "Fix the setting; see the settings reference in the docs.")
E007 = spec("django_taskclaim.E007", "TASKCLAIM_ROUTER = {value!r} is unusable: {problem}.",
            "Set TASKCLAIM_ROUTER to the dotted path of a callable that takes a tenant (a str) and returns "
            "the alias of the database holding its tasks, or remove it to keep every task in "
            "TASKCLAIM_DATABASE.")
E008 = spec("django_taskclaim.E008", "TASKCLAIM_DATABASES = {value!r} is invalid: {problem}.",
            "List every database alias holding task tables, TASKCLAIM_DATABASE among them, each once "
            "and each a key of DATABASES: {aliases}.")
E009 = spec("django_taskclaim.E009", "TASKCLAIM_ROUTER sends {what} to {alias!r}, which is not in "
            "TASKCLAIM_DATABASES ({listed}).",
            "Add {alias!r} to TASKCLAIM_DATABASES (and migrate it), or fix the router: a claim, "
            "claim_next() and the commands only reach the databases listed.")
W005 = spec("django_taskclaim.W005", "{name} is not a setting of django-taskclaim{closest}: it is ignored.",
            "Fix its name (a typo leaves the setting it meant at its default) or remove it; the settings "
            "are listed in the docs' settings reference.")
E006 = spec("django_taskclaim.E006", "{problem}",
            "Set TASKCLAIM_JSON_ENCODER to the dotted path of a json.JSONEncoder subclass, e.g. "
            "'django.core.serializers.json.DjangoJSONEncoder' (the default).")


def check_database(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Each task database must be configured and have a store (E001); its store checks the rest.

    Registered without Django's ``database`` tag, so that every ``manage.py check`` (and
    ``runserver``…) runs it: Django 6.1 leaves tagged checks out unless ``--database`` names an
    alias. It reads settings and at most the server's version (read once per process by Django
    anyway); what needs a query is :func:`check_database_server`.
    """
    alias = settings.DATABASE
    if alias not in django_settings.DATABASES:
        return [E004.error(alias=alias, aliases=", ".join(django_settings.DATABASES))]
    found: list[checks.CheckMessage] = []
    for each in _task_databases():
        found += store.system_check(each, connections[each])
    return found


def check_database_server(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """What only a query tells of each task database Django asks the database checks of
    (``check --database``, ``migrate``): tagged ``database``, and empty without ``databases``
    (Django before 6.1 runs tagged checks without it too)."""
    found: list[checks.CheckMessage] = []
    for each in _task_databases():
        if each in (databases or ()):
            found += store.server_check(each, connections[each])
    return found


def _task_databases() -> list[str]:
    """The task databases that are in DATABASES (E004 and E008 report the others)."""
    return [each for each in _listed() or (settings.DATABASE,) if each in django_settings.DATABASES]


#: A Django task result's id names the database of a task among several (``alias:pk``): at most
#: 64 characters, of which a primary key takes 19.
MAX_ALIAS_LENGTH = 44


def _listed() -> list[str] | None:
    """``TASKCLAIM_DATABASES`` when it is a list of strings, else ``None``."""
    value = getattr(django_settings, "TASKCLAIM_DATABASES", None)
    if isinstance(value, list | tuple) and value and all(isinstance(a, str) for a in value):
        return list(value)
    return None


def check_routing(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``TASKCLAIM_DATABASES`` lists configured aliases, ``TASKCLAIM_DATABASE`` among them (E008);
    the router imports and is callable (E007) and sends tenants only to listed databases (E009):
    the empty tenant, and every alias of the router's ``databases`` attribute when it has one."""
    errors: list[checks.CheckMessage] = []
    configured = list(django_settings.DATABASES)
    value = getattr(django_settings, "TASKCLAIM_DATABASES", None)
    listed = _listed()
    if value is not None:
        problems = []
        if listed is None:
            problems.append("expected a non-empty list of database aliases")
        else:
            problems += [f"{a!r} is not in DATABASES" for a in listed if a not in configured]
            problems += [f"{a!r} is listed twice" for a in sorted(set(listed)) if listed.count(a) > 1]
            if settings.DATABASE not in listed:
                problems.append(f"TASKCLAIM_DATABASE = {settings.DATABASE!r} is not in it")
            if len(listed) > 1:
                problems += [f"{a!r} is longer than {MAX_ALIAS_LENGTH} characters (Django task result ids "
                             "carry it)" for a in listed if len(a) > MAX_ALIAS_LENGTH]
        errors += [E008.error(value=value, problem=p, aliases=", ".join(configured)) for p in problems]
    raw = getattr(django_settings, "TASKCLAIM_ROUTER", None)
    if raw is None:
        return errors
    try:
        router = settings.ROUTER
    except ImproperlyConfigured as exc:
        return [*errors, E007.error(value=raw, problem=str(exc).removeprefix(f"TASKCLAIM_ROUTER = {raw!r} "))]
    targets = settings.DATABASES
    declared = getattr(router, "databases", None)
    try:
        first = router("")  # type: ignore[misc]
    except Exception as exc:  # the router's own bug, reported rather than raised at start-up
        return [*errors, E007.error(value=raw, problem=f"router('') raised {type(exc).__name__}: {exc}")]
    sent: list[tuple[str, object]] = [("the empty tenant ''", first)]
    if declared is not None:
        sent += [("tenants (its 'databases' attribute)", alias) for alias in declared]
    for what, alias in sent:
        if alias not in targets:
            errors.append(E009.error(what=what, alias=alias, listed=", ".join(map(repr, targets))))
    return errors


_NUMERIC = {
    "TASKCLAIM_DEFAULT_LEASE": (int, float),
    "TASKCLAIM_MAX_ATTEMPTS": (int,),
    "TASKCLAIM_MAX_RESULT_BYTES": (int,),
    "TASKCLAIM_POLL_INTERVAL": (int, float),
    "TASKCLAIM_DATABASE_TIMEOUT": (int, float),
    "TASKCLAIM_MAX_PAYLOAD_BYTES": (int,),
    "TASKCLAIM_MAX_LEASE": (int, float),
}
#: Settings that must be a bool (a string such as "no" would read as true).
_BOOLEAN = ("TASKCLAIM_AUDIT", "TASKCLAIM_PREPARED_STATEMENTS")
# Upper bounds: what an integer column holds, and expiry dates the ORM can still load.
_MAXIMUM = {"TASKCLAIM_MAX_ATTEMPTS": MAX_INT, "TASKCLAIM_MAX_LEASE": LEASE_CEILING}


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Each numeric ``TASKCLAIM_*`` setting must be a positive number of the right type, each boolean
    one a bool, and ``TASKCLAIM_RETRY_BACKOFF`` a backoff (E005)."""
    errors: list[checks.CheckMessage] = []
    for name, types in _NUMERIC.items():
        if not hasattr(django_settings, name):
            continue
        value = getattr(django_settings, name)
        if isinstance(value, bool) or not isinstance(value, types):
            errors.append(E005.error(name=name, value=value,
                                 problem=f"expected {' or '.join(t.__name__ for t in types)}"))
        elif value <= 0:
            errors.append(E005.error(name=name, value=value, problem="must be greater than zero"))
        elif name in _MAXIMUM and value > _MAXIMUM[name]:
            errors.append(E005.error(name=name, value=value, problem=f"must be at most {_MAXIMUM[name]:g}"))
    for name in _BOOLEAN:
        value = getattr(django_settings, name, True)
        if not isinstance(value, bool):  # "no" and 0 would be read as a yes and a no without a word
            errors.append(E005.error(name=name, value=value, problem="expected True or False"))
    if hasattr(django_settings, "TASKCLAIM_RETRY_BACKOFF"):
        # Read by a worker only when a task fails: a bad one would fail every worker after its claim.
        value = getattr(django_settings, "TASKCLAIM_RETRY_BACKOFF")  # noqa: B009 (not in the stubs)
        try:
            Backoff.of(Backoff() if value is None else value, "it")
        except (InvalidArgument, TypeError) as exc:
            errors.append(E005.error(name="TASKCLAIM_RETRY_BACKOFF", value=value, problem=str(exc)))
    if not errors and hasattr(django_settings, "TASKCLAIM_DEFAULT_LEASE"):
        try:
            lease_seconds(None)  # between the minimum lease and TASKCLAIM_MAX_LEASE
        except InvalidLease as exc:
            errors.append(E005.error(name="TASKCLAIM_DEFAULT_LEASE", value=settings.DEFAULT_LEASE,
                                 problem=str(exc)))
    try:
        json_encoder()
    except ImproperlyConfigured as exc:
        errors.append(E006.error(problem=str(exc)))
    return errors


def check_setting_names(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A ``TASKCLAIM_*`` name the app does not read is a typo, most likely (W005, with the closest
    known name): the setting it meant stays at its default without a word."""
    found: list[checks.CheckMessage] = []
    for name in sorted(dir(django_settings)):
        if name.startswith("TASKCLAIM_") and name not in KNOWN_SETTINGS:
            # Compared without the prefix every name shares, which would make any two look alike.
            close = get_close_matches(name.removeprefix("TASKCLAIM_"),
                                      [known.removeprefix("TASKCLAIM_") for known in KNOWN_SETTINGS], n=1)
            found.append(W005.warning(name=name, closest=f" (did you mean TASKCLAIM_{close[0]}?)" if close else ""))
    return found


#: Where Django's Tasks framework registers its check of every task backend (``check_tasks``, which
#: runs each backend's ``check()``), in the order ``tasks/compat.py`` picks the framework.
FRAMEWORK_CHECKS = (("django.tasks", "django.tasks.checks"), ("django_tasks", "django_tasks.checks"))


def register_framework_checks() -> None:
    """Register the Tasks framework's own check of the task backends, before any check list is built.

    The framework registers it when its module is first imported: Django 6 when ``django.tasks`` is,
    which may happen only while ``manage.py check`` runs (an URLconf importing a task module), after
    the list of checks to run was taken; the backport in its ``AppConfig.ready()``, never when it is
    not in ``INSTALLED_APPS``. Either way ``ClaimBackend.check()`` (E201, W201–W203) went unrun.
    Importing the module here registers that one function (a set: never twice)."""
    for framework, module in FRAMEWORK_CHECKS:
        if find_spec(framework) is not None:
            import_module(module)
            return


def register() -> None:
    checks.register(check_database)
    checks.register(check_database_server, checks.Tags.database)
    checks.register(check_settings)
    checks.register(check_setting_names)
    checks.register(check_routing)
    register_caller()
    register_framework_checks()
