"""The checks ``ClaimBackend.check()`` returns: every setting it cannot honour."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS

from ..checkspec import spec
from ..conf import settings
from ..exceptions import InvalidArgument, TaskClaimError
from ..retries import Backoff
from ..values import lease_seconds, positive_int, timeout_seconds
from .compat import FRAMEWORK
from .identity import import_grace

#: What ``OPTIONS`` may hold, and what each is.
KNOWN_OPTIONS = {
    "LEASE": "seconds a worker's claim lasts between heartbeats (default TASKCLAIM_DEFAULT_LEASE)",
    "MAX_ATTEMPTS": "claims a task may get before it ends FAILED (default TASKCLAIM_MAX_ATTEMPTS)",
    "BACKOFF": "retry backoff: a dict of Backoff's fields (default TASKCLAIM_RETRY_BACKOFF)",
    "TIMEOUT": "seconds an attempt may run before its claim is fenced off and it is recorded as failed "
               "with TimedOut (default: none)",
    "IMPORT_GRACE": "seconds after its enqueue during which a task a worker cannot import is released "
                    "uncharged, not failed (default 600: a rolling deploy's old workers)",
}

E201 = spec("django_taskclaim.E201", "Task backend {alias!r}: {problem}.",
        "Fix TASKS[{alias!r}]['OPTIONS']: known options are LEASE, MAX_ATTEMPTS, BACKOFF, TIMEOUT and IMPORT_GRACE.")
W201 = spec("django_taskclaim.W201", "Task backend {alias!r} stores {where}.",
        "enqueue() inside transaction.atomic() on {default!r} does not commit or roll back with the "
        "task: a task can outlive a rolled-back caller (or the caller's rows be missing when it runs). "
        "Enqueue inside transaction.atomic(using={using!r}), or keep the task table in the database of "
        "the rows the tasks work on (TASKCLAIM_DATABASE).")
W202 = spec("django_taskclaim.W202", "Task backend {alias!r}: TASKCLAIM_AUDIT is False.",
        "Results read their errors, worker ids and attempt counts from the attempt rows, which "
        "TASKCLAIM_AUDIT = False does not write: get_result() reports none of them. Set it True.")
W203 = spec("django_taskclaim.W203", "Task backend {alias!r} runs on the django_tasks backport, which is not in "
        "INSTALLED_APPS.",
        "Add 'django_tasks' to INSTALLED_APPS, as the backport asks: without it its AppConfig does not "
        "run (django_taskclaim registers the task backends' checks for it).")


def backend_messages(backend: Any) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = [E201.error(alias=backend.alias, problem=problem)
                for problem in options_problems(backend)]
    for using in settings.DATABASES:  # each database a tenant's tasks may be enqueued in
        if differs_from_callers(using):
            messages.append(W201.warning(alias=backend.alias, using=using, default=DEFAULT_DB_ALIAS,
                                         where=stored_where(using)))
    if not settings.AUDIT:
        messages.append(W202.warning(alias=backend.alias))
    if FRAMEWORK == "django_tasks" and not apps.is_installed("django_tasks"):
        messages.append(W203.warning(alias=backend.alias))
    return messages


def refuse_unusable(backend: Any) -> None:
    """``ImproperlyConfigured`` with the messages of ``backend``'s check errors, if it has any: a
    worker refuses to claim with a configuration it cannot use (each claim would fail its task,
    spending an attempt per restart) rather than find out on the first task."""
    errors = [message for message in backend.check() if message.is_serious()]
    if errors:
        raise ImproperlyConfigured("; ".join(f"{m.msg} ({m.id}) {m.hint}" for m in errors))


def options_problems(backend: Any) -> list[str]:
    """What is wrong with a backend's ``OPTIONS`` (each a sentence naming the option)."""
    problems = [f"unknown option {name!r} (known: {', '.join(KNOWN_OPTIONS)})"
                for name in backend.options if name not in KNOWN_OPTIONS]
    for name, read in (("LEASE", lambda v: lease_seconds(v)),
                       ("MAX_ATTEMPTS", lambda v: positive_int(v, "OPTIONS['MAX_ATTEMPTS']")),
                       ("BACKOFF", lambda v: Backoff.of(v, "OPTIONS['BACKOFF']")),
                       ("TIMEOUT", lambda v: timeout_seconds(v, "OPTIONS['TIMEOUT']")),
                       ("IMPORT_GRACE", lambda v: import_grace(v))):
        if backend.options.get(name) is not None:
            try:
                read(backend.options[name])
            except (TaskClaimError, InvalidArgument, TypeError, ValueError) as exc:
                problems.append(f"OPTIONS[{name!r}] = {backend.options[name]!r}: {exc}")
    return problems


def stored_where(using: str) -> str:
    """Which tasks task database ``using`` holds, and where the others are, in words (W201)."""
    task_databases = settings.DATABASES
    if len(task_databases) == 1:
        return f"tasks in database {using!r}, not in {DEFAULT_DB_ALIAS!r}"
    others = " and ".join(repr(alias) for alias in task_databases if alias != using)
    where = f"the tasks of the tenants routed to {using!r} in that database, the other tenants' in {others}"
    return where if DEFAULT_DB_ALIAS in task_databases else f"{where}, none in {DEFAULT_DB_ALIAS!r}"


def differs_from_callers(using: str) -> bool:
    """Whether the task table lives elsewhere than the project's own rows (the default alias)."""
    return using != DEFAULT_DB_ALIAS


