"""System checks: IDs, messages and hints kept together here.

=====================  ====================================================================
ID                     Problem
=====================  ====================================================================
``django_taskclaim.E001``  The task database's vendor has no store (``store.VENDORS``).
``django_taskclaim.E002``  The database server is too old (SQLite before 3.35, MySQL before
                           8.0.1, MariaDB before 10.6: see each store's ``unsupported()``).
``django_taskclaim.E003``  SQLite or MySQL with ``USE_TZ = False`` (leases are compared in UTC).
``django_taskclaim.E004``  ``TASKCLAIM_DATABASE`` names no configured database.
``django_taskclaim.E005``  A ``TASKCLAIM_*`` setting has the wrong type or range.
``django_taskclaim.E006``  ``TASKCLAIM_JSON_ENCODER`` is not an importable ``JSONEncoder``.
``django_taskclaim.E010``  PostgreSQL behind a transaction-mode pooler (the database has
                           ``DISABLE_SERVER_SIDE_CURSORS = True``) with
                           ``TASKCLAIM_PREPARED_STATEMENTS`` on.
``django_taskclaim.W020``  SQLite's busy timeout (``OPTIONS["timeout"]``, 5 s by default) is
                           shorter than the recommended 30 s for concurrent workers.
``django_taskclaim.W021``  MySQL/MariaDB with a transaction isolation level other than
                           ``read committed`` (Django's default for MySQL).
``django_taskclaim.E101``  ``TASKCLAIM_CELERY_APP`` cannot be loaded.
``django_taskclaim.W101``  Celery: a claimed task runs with ``acks_late`` off.
``django_taskclaim.W102``  Celery: ``worker_prefetch_multiplier`` is above 1.
``django_taskclaim.W103``  Celery: a claimed task runs with ``reject_on_worker_lost`` off.
``django_taskclaim.W104``  Celery: the broker's visibility timeout is not longer than the
                           longest lease or time limit of a claimed task.
``django_taskclaim.W105``  Celery on RabbitMQ: ``consumer_timeout`` is not longer than the
                           longest time limit of a claimed task with ``acks_late``.
``django_taskclaim.W106``  Celery on RabbitMQ: a quorum queue's ``x-delivery-limit`` is lower
                           than the ``max_attempts`` of a claimed task on it.
=====================  ====================================================================

The Celery checks (1xx) run only when the bridge is in use: some ``claimed_task`` is defined
(after importing the modules the project's worker would import), or ``TASKCLAIM_CELERY_APP``
is set. They read the configuration of the app that ``django_taskclaim.celery.celery_app()``
returns (``TASKCLAIM_CELERY_APP``, else the project's app as ``celery -A proj`` finds it),
as the worker would see it, after importing the modules a worker imports (the app's
``imports``/``include`` and each installed Django app's ``tasks`` module).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from .conf import settings
from .exceptions import InvalidLease
from .keys import LEASE_CEILING, MAX_INT, json_encoder, lease_seconds
from .store import VENDORS

E001 = ("django_taskclaim.E001", "Database {alias!r} ({vendor}) is not supported by django-taskclaim.",
        "Use PostgreSQL or MySQL/MariaDB (production) or SQLite (development) for the task "
        "table; set TASKCLAIM_DATABASE to an alias of one of them.")
E002 = ("django_taskclaim.E002", "Database {alias!r} cannot hold the task table: {problem}.",
        "Upgrade the database server (or the SQLite library) to a supported version; see "
        "docs/databases.md.")
E003 = ("django_taskclaim.E003", "USE_TZ is False with {vendor}.",
        "Leases are compared with the database's UTC clock, and {vendor} stores datetimes without "
        "a time zone: set USE_TZ = True, so that Django stores them in UTC too.")
E004 = ("django_taskclaim.E004", "TASKCLAIM_DATABASE = {alias!r} is not in DATABASES.",
        "Set TASKCLAIM_DATABASE to one of: {aliases}.")
E005 = ("django_taskclaim.E005", "{name} = {value!r} is invalid: {problem}.",
        "Fix the setting; see the settings reference in the docs.")
#: Seconds a SQLite connection waits for the write lock before "database is locked". Measured:
#: 24 queue workers (claim_next + fenced()) on one file saw the error with Django's default
#: 5 s and none with 20 s; 30 s leaves room for a loaded machine.
RECOMMENDED_SQLITE_TIMEOUT = 30.0
SQLITE_DEFAULT_TIMEOUT = 5.0  # Python's sqlite3.connect() default, which Django keeps
W020 = ("django_taskclaim.W020", "SQLite database {alias!r} waits {timeout} for a lock before "
        "\"database is locked\".",
        "Set DATABASES[{alias!r}]['OPTIONS']['timeout'] = 30 (seconds) or more: SQLite has one "
        "writer, and with several workers (claim_next, fenced(), run_once) a writer can wait "
        "longer than the default 5 s for its turn.")
W021 = ("django_taskclaim.W021", "MySQL database {alias!r} runs transactions at isolation level "
        "{level!r}.",
        "Remove OPTIONS['isolation_level'] (Django's default for MySQL is 'read committed') or set it "
        "to 'read committed': under 'repeatable read' a claim that lost a race can read an old "
        "snapshot of the task inside the caller's transaction, and InnoDB's gap locks make racing "
        "claims deadlock more often.")
E006 = ("django_taskclaim.E006", "{problem}",
        "Set TASKCLAIM_JSON_ENCODER to the dotted path of a json.JSONEncoder subclass, e.g. "
        "'django.core.serializers.json.DjangoJSONEncoder' (the default).")
E010 = ("django_taskclaim.E010", "Database {alias!r} is set up for a transaction-mode connection pooler "
        "(DISABLE_SERVER_SIDE_CURSORS = True) and TASKCLAIM_PREPARED_STATEMENTS is on.",
        "Set TASKCLAIM_PREPARED_STATEMENTS = False. A pooler in transaction mode (PgBouncer's "
        "pool_mode = transaction, and the like) runs each transaction on any server session, where "
        "the statements django-taskclaim prepared in another session do not exist (PgBouncer "
        "1.21+ with max_prepared_statements may carry them: untested, see docs/configurations.md).")
E101 = ("django_taskclaim.E101", "The Celery app cannot be loaded: {problem}",
        "Set TASKCLAIM_CELERY_APP to the dotted path of your Celery app, e.g. 'proj.celery.app'.")
W101 = ("django_taskclaim.W101", "Celery acks_late is off for claimed task(s): {tasks}.",
        "Set CELERY_TASK_ACKS_LATE = True (or acks_late=True on the task): with early acks a "
        "message is acknowledged before the body runs, and a worker that dies mid-task loses it "
        "(only 'reclaim --requeue' brings it back).")
W102 = ("django_taskclaim.W102", "Celery worker_prefetch_multiplier is {value}.",
        "Set CELERY_WORKER_PREFETCH_MULTIPLIER = 1: prefetched messages wait unacknowledged behind "
        "a busy worker slot, where a Redis/SQS visibility timeout delivers them a second time, where "
        "RabbitMQ's consumer_timeout runs for them too (closing the worker's channel), and a crash of "
        "that worker delays all of them.")
W103 = ("django_taskclaim.W103", "Celery reject_on_worker_lost is off for claimed task(s): {tasks}.",
        "Set CELERY_TASK_REJECT_ON_WORKER_LOST = True: with acks_late, a message whose worker "
        "process was killed is then requeued instead of acknowledged as failed; the claim makes the "
        "redelivery harmless.")
W104 = ("django_taskclaim.W104", "The broker's visibility_timeout ({timeout:g}s) is not longer than "
        "{what} ({longest:g}s) of claimed task {task}.",
        "Raise CELERY_BROKER_TRANSPORT_OPTIONS['visibility_timeout'] above the longest time limit "
        "(set time_limit on long tasks): an unacknowledged message older than the timeout is "
        "delivered again while the first delivery still runs.")


W105 = ("django_taskclaim.W105", "RabbitMQ's consumer_timeout ({timeout:g}s{source}) is not longer than "
        "the time limit ({longest:g}s) of claimed task {task}, which acknowledges late.",
        "Raise consumer_timeout above the longest time limit: in rabbitmq.conf (consumer_timeout, "
        "in ms; a client cannot read it) or per queue with the 'x-consumer-timeout' argument in "
        "CELERY_TASK_QUEUES (RabbitMQ 3.12+). A delivery unacknowledged for longer makes RabbitMQ "
        "close the worker's channel (Celery's worker then stops) and deliver the message again; "
        "the claim keeps the body from running twice, but the worker is lost.")
W106 = ("django_taskclaim.W106", "Quorum queue {queue!r} has x-delivery-limit {limit} but claimed task "
        "{task} allows max_attempts {attempts}.",
        "Set x-delivery-limit to at least max_attempts, or lower max_attempts: whichever is lower "
        "ends a message that keeps killing its worker. When RabbitMQ's limit comes first it drops "
        "(or dead-letters) the message while the task stays unfinished in the database, until "
        "'reclaim --requeue' sends it again; when max_attempts comes first the task ends FAILED "
        "and every later delivery raises TaskFailed. (A busy retry publishes a new message, so "
        "RabbitMQ counts only the returns that found the task free.)")


def _error(spec: tuple[str, str, str], **fmt: Any) -> checks.Error:
    check_id, msg, hint = spec
    return checks.Error(msg.format(**fmt), hint=hint.format(**fmt), id=check_id)


def _warning(spec: tuple[str, str, str], **fmt: Any) -> checks.Warning:
    check_id, msg, hint = spec
    return checks.Warning(msg.format(**fmt), hint=hint.format(**fmt), id=check_id)


def _sqlite_timeout_warning(alias: str) -> checks.CheckMessage | None:
    database: dict[str, Any] = django_settings.DATABASES[alias]
    options: dict[str, Any] = database.get("OPTIONS") or {}
    timeout = options.get("timeout", SQLITE_DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        return _warning(W020, alias=alias, timeout=f"{timeout!r} (not a number of seconds)")
    if timeout < RECOMMENDED_SQLITE_TIMEOUT:
        default = " (the default)" if "timeout" not in options else ""
        return _warning(W020, alias=alias, timeout=f"{timeout:g} s{default}")
    return None


def check_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The task database must have a store and a server it supports.

No query is made, except that MySQL's version is read from the server (once per process).
"""
    alias = settings.DATABASE
    if alias not in django_settings.DATABASES:
        return [_error(E004, alias=alias, aliases=", ".join(django_settings.DATABASES))]
    vendor = connections[alias].vendor
    store = VENDORS.get(vendor)
    if store is None:
        return [_error(E001, alias=alias, vendor=vendor)]
    errors: list[checks.CheckMessage] = []
    if (problem := store.unsupported(connections[alias])) is not None:
        errors.append(_error(E002, alias=alias, problem=problem))
    if vendor in ("sqlite", "mysql") and not django_settings.USE_TZ:
        errors.append(_error(E003, vendor="SQLite" if vendor == "sqlite" else "MySQL/MariaDB"))
    if vendor == "mysql":
        options: dict[str, Any] = connections[alias].settings_dict.get("OPTIONS") or {}
        level = options.get("isolation_level", "read committed")
        if str(level or "").lower() != "read committed":
            errors.append(_warning(W021, alias=alias, level=level))
    if vendor == "sqlite" and (warning := _sqlite_timeout_warning(alias)) is not None:
        errors.append(warning)
    return errors


def check_pooler(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Prepared statements cannot live behind a transaction-mode pooler (no query is made).

    Django asks for ``DISABLE_SERVER_SIDE_CURSORS = True`` exactly there (PgBouncer in
    transaction mode), so that setting is the sign; a session-mode pooler or Django's own pool
    keeps a session per connection, where prepared statements work.
    """
    alias = settings.DATABASE
    if alias not in django_settings.DATABASES or connections[alias].vendor != "postgresql":
        return []
    if connections[alias].settings_dict.get("DISABLE_SERVER_SIDE_CURSORS") and settings.PREPARED_STATEMENTS:
        return [_error(E010, alias=alias)]
    return []


_NUMERIC = {
    "TASKCLAIM_DEFAULT_LEASE": (int, float),
    "TASKCLAIM_MAX_ATTEMPTS": (int,),
    "TASKCLAIM_MAX_RESULT_BYTES": (int,),
    "TASKCLAIM_POLL_INTERVAL": (int, float),
    "TASKCLAIM_MAX_PAYLOAD_BYTES": (int,),
    "TASKCLAIM_MAX_LEASE": (int, float),
}
# Upper bounds: what an integer column holds, and expiry dates the ORM can still load.
_MAXIMUM = {"TASKCLAIM_MAX_ATTEMPTS": MAX_INT, "TASKCLAIM_MAX_LEASE": LEASE_CEILING}


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Each numeric ``TASKCLAIM_*`` setting must be a positive number of the right type."""
    errors: list[checks.CheckMessage] = []
    for name, types in _NUMERIC.items():
        if not hasattr(django_settings, name):
            continue
        value = getattr(django_settings, name)
        if isinstance(value, bool) or not isinstance(value, types):
            errors.append(_error(E005, name=name, value=value,
                                 problem=f"expected {' or '.join(t.__name__ for t in types)}"))
        elif value <= 0:
            errors.append(_error(E005, name=name, value=value, problem="must be greater than zero"))
        elif name in _MAXIMUM and value > _MAXIMUM[name]:
            errors.append(_error(E005, name=name, value=value, problem=f"must be at most {_MAXIMUM[name]:g}"))
    if not errors and hasattr(django_settings, "TASKCLAIM_DEFAULT_LEASE"):
        try:
            lease_seconds(None)  # between the minimum lease and TASKCLAIM_MAX_LEASE
        except InvalidLease as exc:
            errors.append(_error(E005, name="TASKCLAIM_DEFAULT_LEASE", value=settings.DEFAULT_LEASE,
                                 problem=str(exc)))
    try:
        json_encoder()
    except ImproperlyConfigured as exc:
        errors.append(_error(E006, problem=str(exc)))
    return errors


def check_celery(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The Celery settings that turn redeliveries into lost work or needless duplicates."""
    try:
        from . import celery as bridge
    except ImportError:  # Celery is not installed: the bridge cannot be in use
        return []
    if not bridge.in_use():
        return []
    try:
        app = bridge.celery_app()
        bridge.import_task_modules(app)
        conf = app.conf
        defaults = {name: conf[name] for name in ("task_acks_late", "task_reject_on_worker_lost",
                                                  "task_time_limit", "task_soft_time_limit")}
        prefetch = conf.worker_prefetch_multiplier
        timeout = bridge.visibility_timeout(app)
        rabbitmq = _rabbitmq_messages(bridge, app, bridge.claimed_tasks(), defaults)
    except (ImproperlyConfigured, ImportError) as exc:
        return [_error(E101, problem=f"{type(exc).__name__}: {exc}")]

    specs = bridge.claimed_tasks()

    def effective(option: str, setting: str) -> list[str]:
        """Labels of claimed tasks (or 'the app default') where ``option`` is off."""
        if not specs:
            return [] if defaults[setting] else ["(app default)"]
        return [s.label for s in specs if not s.celery_options.get(option, defaults[setting])]

    messages: list[checks.CheckMessage] = []
    if off := effective("acks_late", "task_acks_late"):
        messages.append(_warning(W101, tasks=", ".join(off)))
    if isinstance(prefetch, int) and prefetch > 1:
        messages.append(_warning(W102, value=prefetch))
    if off := effective("reject_on_worker_lost", "task_reject_on_worker_lost"):
        messages.append(_warning(W103, tasks=", ".join(off)))
    if timeout is not None:
        worst: tuple[float, str, str] | None = None
        for spec in specs:
            candidates = [(spec.lease_seconds, "the lease")]
            for option, setting in (("time_limit", "task_time_limit"), ("soft_time_limit", "task_soft_time_limit")):
                limit = spec.celery_options.get(option, defaults[setting])
                if limit:
                    candidates.append((float(limit), f"the {option.replace('_', ' ')}"))
            longest, what = max(candidates)
            if longest >= timeout and (worst is None or longest > worst[0]):
                worst = (longest, what, spec.label)
        if worst is not None:
            messages.append(_warning(W104, timeout=timeout, longest=worst[0], what=worst[1], task=worst[2]))
    return messages + rabbitmq


def _rabbitmq_messages(bridge: Any, app: Any, specs: list[Any], defaults: dict[str, Any]) -> list[checks.CheckMessage]:
    """W105/W106: RabbitMQ's consumer timeout and quorum delivery limit against the claimed tasks."""
    if bridge.broker_scheme(app) not in bridge.AMQP_SCHEMES:
        return []
    messages: list[checks.CheckMessage] = []
    worst: tuple[float, str, float, bool] | None = None  # (limit, task, timeout, timeout set by the app)
    short: tuple[str, int, str, int] | None = None  # (queue, limit, task, max_attempts)
    for spec in specs:
        queue = spec.celery_options.get("queue")
        if spec.celery_options.get("acks_late", defaults["task_acks_late"]):
            timeout, known = bridge.consumer_timeout(app, queue)
            limits = [spec.celery_options.get(option, defaults[setting]) for option, setting in
                      (("time_limit", "task_time_limit"), ("soft_time_limit", "task_soft_time_limit"))]
            longest = max((float(v) for v in limits if v), default=0.0)
            if longest and longest >= timeout and (worst is None or longest > worst[0]):
                worst = (longest, spec.label, timeout, known)
        args = bridge.queue_arguments(app, queue)
        limit = args.get("x-delivery-limit")
        if args.get("x-queue-type") == "quorum" and isinstance(limit, int) and not isinstance(limit, bool):
            attempts = spec.max_attempts or settings.MAX_ATTEMPTS
            if limit < attempts and (short is None or attempts - limit > short[3] - short[1]):
                short = (queue or app.conf.task_default_queue, limit, spec.label, attempts)
    if worst is not None:
        source = ", x-consumer-timeout" if worst[3] else ", RabbitMQ's default: the server's setting cannot be read"
        messages.append(_warning(W105, timeout=worst[2], source=source, longest=worst[0], task=worst[1]))
    if short is not None:
        messages.append(_warning(W106, queue=short[0], limit=short[1], task=short[2], attempts=short[3]))
    return messages


def register() -> None:
    checks.register(check_database)
    checks.register(check_settings)
    checks.register(check_pooler)
    checks.register(check_celery)
