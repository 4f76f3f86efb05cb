"""The Celery bridge: Celery tasks whose body runs under a claim, and enqueue-once on commit.

The database is the source of truth; a broker message is only a signal to go and look.
A message delivered twice (visibility timeout, ``acks_late`` redelivery, a double click)
finds its task RUNNING or SUCCEEDED and never runs the body a second time.

    from django_taskclaim.celery import claimed_task, enqueue_once

    @claimed_task(key="invoice-{order_id}", lease=60, acks_late=True)
    def send_invoice(order_id): ...

    @claimed_task(key=lambda order_id: f"ship-{order_id}", app=app, bind=True)
    def ship(self, order_id):
        with self.claim.fenced():          # commits only while this worker owns the task
            Shipment.objects.create(order_id=order_id)

    enqueue_once(send_invoice, key="invoice-42", kwargs={"order_id": 42})

See ``docs/celery.md`` for the recommended Celery settings and the behaviour on each kind
of duplicate.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import string
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery import Celery, Task, shared_task
from celery.exceptions import Ignore, Reject, Retry
from celery.result import AsyncResult
from celery.utils import uuid
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string, module_has_submodule

from . import claims
from .conf import settings
from .exceptions import InvalidTaskKey, StaleClaim, TaskFailed
from .keys import TaskKey, lease_seconds, positive_int, resolve_identity
from .lifecycle import Claim
from .store import DbNow, DbNowPlus

logger = logging.getLogger("django_taskclaim")

ON_BUSY = ("retry", "skip", "wait")
#: Default ``manage.py reclaim --requeue-after``: a PENDING task enqueued through the bridge
#: whose message was last sent longer ago than this is considered lost and sent again.
REQUEUE_AFTER = 300.0
#: Brokers that hide an unacknowledged message for a while and then deliver it again, with
#: kombu's default visibility timeout in seconds.
VISIBILITY_TIMEOUT_DEFAULTS = {"redis": 3600.0, "rediss": 3600.0, "sentinel": 3600.0, "sqs": 1800.0}
#: Brokers speaking AMQP 0-9-1 (RabbitMQ), whose ``consumer_timeout`` closes the channel of a
#: delivery left unacknowledged for too long, and RabbitMQ's default for it in seconds.
AMQP_SCHEMES = ("amqp", "amqps", "pyamqp", "librabbitmq")
CONSUMER_TIMEOUT_DEFAULT = 1800.0

KeySpec = str | TaskKey | Callable[..., "str | TaskKey"]


# -- finding the Celery app --------------------------------------------------------------


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


def broker_scheme(app: Celery) -> str:
    """The scheme of the app's (first) broker URL: ``redis``, ``amqp``, ``sqs``…"""
    url = app.conf.broker_url or ""
    if isinstance(url, list | tuple):
        url = url[0] if url else ""
    if not url:
        return "amqp"  # Celery's default broker
    return str(url).split("://", 1)[0].split("+", 1)[0].split(";", 1)[0].lower()


def visibility_timeout(app: Celery) -> float | None:
    """Seconds after which the broker delivers an unacknowledged message again, if it does."""
    scheme = broker_scheme(app)
    if scheme not in VISIBILITY_TIMEOUT_DEFAULTS:
        return None
    options = app.conf.broker_transport_options or {}
    return float(options.get("visibility_timeout", VISIBILITY_TIMEOUT_DEFAULTS[scheme]))


def queue_arguments(app: Celery, queue: str | None) -> dict[str, Any]:
    """The ``x-`` arguments the app declares ``queue`` with (its default queue when ``None``)."""
    name = queue or app.conf.task_default_queue
    # Built afresh from the configuration: app.amqp.queues is cached on first use.
    declared = app.amqp.Queues(app.conf.task_queues).get(name)
    if declared is None:
        return {}
    return {**(declared.queue_arguments or {}), **(declared.consumer_arguments or {})}


def consumer_timeout(app: Celery, queue: str | None = None) -> tuple[float, bool] | None:
    """RabbitMQ's ``consumer_timeout`` for ``queue`` in seconds, and whether the app sets it.

    ``None`` for brokers other than RabbitMQ. A queue or consumer argument
    ``x-consumer-timeout`` (milliseconds; RabbitMQ 3.12+) is read from ``task_queues``. The
    server-wide ``consumer_timeout`` of ``rabbitmq.conf`` cannot be read by a client: without
    the argument, RabbitMQ's default (30 minutes) is assumed, with ``False``.
    """
    if broker_scheme(app) not in AMQP_SCHEMES:
        return None
    value = queue_arguments(app, queue).get("x-consumer-timeout")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value) / 1000, True
    return CONSUMER_TIMEOUT_DEFAULT, False


# -- options of a claimed task -------------------------------------------------------------


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


# -- the task base class ---------------------------------------------------------------------


@dataclass
class _Run:
    """The claim of one body execution; ``settled`` once its outcome was written."""

    claim: Claim
    settled: bool = False


_FENCED_OFF = object()


class ClaimedTask(Task):
    """Base class of tasks made by :func:`claimed_task`; its ``__call__`` runs the body under a claim.

    A custom base passed as ``base=`` is combined with this one.
    """

    abstract = True
    taskclaim: ClaimOptions | None = None
    _taskclaim_local = threading.local()

    # -- the claim of the running body ---------------------------------------------------
    @classmethod
    def _runs(cls) -> list[_Run]:
        stack: list[_Run] | None = getattr(cls._taskclaim_local, "runs", None)
        if stack is None:
            stack = cls._taskclaim_local.runs = []
        return stack

    @property
    def claim(self) -> Claim:
        """The claim the body runs under (for ``self.claim.fenced()``, ``.check()``, ``.key``)."""
        runs = self._runs()
        if not runs:
            raise RuntimeError(f"{self.name}.claim is only available while the task body runs")
        return runs[-1].claim

    # -- execution -------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.request.called_directly:
            # Called by Celery's tracer, which already pushed the request (id, retries, ...).
            return self._claimed_call(args, kwargs)
        from celery.app.task import _task_stack

        _task_stack.push(self)
        self.push_request(args=args, kwargs=kwargs)
        try:
            return self._claimed_call(args, kwargs)
        finally:
            self.pop_request()
            _task_stack.pop()

    def _options(self) -> ClaimOptions:
        if self.taskclaim is None:
            raise ImproperlyConfigured(f"{self.name} uses ClaimedTask without claimed_task(...) options")
        return self.taskclaim

    def _claimed_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from .models import Task as TaskRow
        from .runner import _wait_while_busy

        opts = self._options()
        key, tenant = opts.identity(args, kwargs)
        request = self.request
        delivery_id = str(request.id or "")
        # Direct and eager calls cannot re-publish themselves: they wait instead of "retry".
        direct = bool(request.called_directly or request.is_eager)
        while True:
            outcome = claims.claim(key, tenant, lease=opts.lease, max_attempts=opts.max_attempts,
                                   delivery_id=delivery_id)
            if outcome.claim is not None:
                value = self._run_under(outcome.claim, args, kwargs)
                if value is not _FENCED_OFF:
                    return value
                # Fenced off: another worker took over; from here on this is a duplicate.
                task = TaskRow.objects.using(outcome.claim.using).get(pk=outcome.claim.task_id)
            else:
                task = outcome.task
            if task.status == TaskRow.Status.SUCCEEDED:
                return task.result
            if task.status in (TaskRow.Status.FAILED, TaskRow.Status.CANCELLED):
                raise TaskFailed(task)
            if task.status == TaskRow.Status.PENDING:
                continue
            if opts.on_busy == "skip":
                logger.info("duplicate delivery skipped", extra={"key": key, "tenant": tenant,
                                                                  "delivery_id": delivery_id})
                raise Ignore()
            if opts.on_busy == "retry" and not direct:
                raise self._busy_retry(task, opts)
            _wait_while_busy(task)

    def _run_under(self, claim: Claim, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        run = _Run(claim)
        runs = self._runs()
        runs.append(run)
        try:
            with claim.keepalive():
                result = self.run(*args, **kwargs)
        except StaleClaim:
            return _FENCED_OFF
        except Retry as exc:
            # Raised by self.retry() (already settled there) or by the body itself.
            self._settle(run, exc.exc or exc.message or "retry", retry=True)
            raise
        except Reject as exc:
            self._settle(run, exc.reason or "rejected", retry=bool(exc.requeue))
            raise
        except Ignore:
            if not run.settled:
                run.settled = True
                self._quietly(claim.release)
            raise
        except Exception as exc:
            # Celery will not retry this one (autoretry and self.retry() raise Retry).
            self._settle(run, exc, retry=False)
            raise
        except BaseException:
            # Worker shutdown or interruption: give the task back untouched.
            if not run.settled:
                run.settled = True
                self._quietly(claim.release)
            raise
        finally:
            runs.remove(run)
        if run.settled:  # self.retry(throw=False) scheduled a retry and the body returned
            return result
        return self._store(claim, result)

    def _store(self, claim: Claim, result: Any) -> Any:
        from .models import Task as TaskRow

        row = (TaskRow.objects.using(claim.using).filter(pk=claim.task_id)
               .values_list("status", "fencing_token", "result").first())
        if row is not None and row[0] == TaskRow.Status.SUCCEEDED and row[1] == claim.token:
            return row[2]  # the body completed inside self.claim.fenced(): keep what it stored
        try:
            claims.complete_or_fail(claim, result)  # a result it cannot store ends the task FAILED
        except StaleClaim:
            return _FENCED_OFF
        return result

    def _settle(self, run: _Run, error: BaseException | str, *, retry: bool) -> str | None:
        if run.settled:
            return None
        run.settled = True
        try:
            return run.claim.fail(error, retry=retry)
        except StaleClaim:
            logger.warning("failure of a fenced-off claim not recorded", extra=run.claim._log_extra())
            return None

    @staticmethod
    def _quietly(action: Callable[[], Any]) -> None:
        with suppress(StaleClaim):  # fenced off already: nothing of ours to give back
            action()

    def retry(self, args: Any = None, kwargs: Any = None, exc: BaseException | None = None,
              throw: bool = True, eta: Any = None, countdown: Any = None,
              max_retries: int | None = None, **options: Any) -> Any:
        """Celery's retry, in step with the database: the attempt is recorded first.

        When Celery will retry, the task goes back to PENDING unless its ``max_attempts`` are
        spent, in which case it ends FAILED and no retry is published. When Celery gives up
        (``max_retries``), the task ends FAILED.
        """
        runs = self._runs()
        run = runs[-1] if runs else None
        if run is None or run.settled:
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)
        request = self.request
        limit = self.max_retries if max_retries is None else max_retries
        celery_retries = not request.called_directly and not (
            limit is not None and request.retries + 1 > limit)
        error: BaseException | str = exc if exc is not None else "retry requested"
        if celery_retries:
            run.settled = True
            status = run.claim.fail(error, retry=True)  # StaleClaim: fenced off, publish nothing
            if status != "pending":
                logger.info("max_attempts reached: not retrying", extra=run.claim._log_extra())
                if exc is not None:
                    raise exc
                from .models import Task as TaskRow

                raise TaskFailed(TaskRow.objects.using(run.claim.using).get(pk=run.claim.task_id))
        else:
            self._settle(run, error, retry=False)
        return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)

    def _busy_retry(self, task: Any, opts: ClaimOptions) -> Retry:
        """Publish this message again after a short countdown, without using up ``max_retries``."""
        countdown = busy_countdown(opts, self.app)
        request = self.request
        sig = self.signature_from_request(request, None, None, countdown=countdown, retries=request.retries)
        sig.apply_async()
        logger.info("task busy: checking again in %.1fs", countdown,
                    extra={"key": task.key, "tenant": task.tenant, "token": task.fencing_token,
                           "owner": task.owner, "delivery_id": request.id})
        return Retry(f"task {task.key!r} is running under {task.owner!r}", when=countdown, sig=sig)


def busy_countdown(opts: ClaimOptions, app: Celery) -> float:
    """Seconds before a busy delivery looks again: ``busy_countdown``, else ``lease / 2`` (0.5-30 s).

    Always below half the broker's visibility timeout (Redis, SQS) or consumer timeout
    (RabbitMQ, when ``task_queues`` sets ``x-consumer-timeout``): a message waiting for its
    ETA sits unacknowledged in the worker, and past the timeout the broker would deliver it
    once more (RabbitMQ also closes the worker's channel).
    """
    countdown = opts.busy_countdown
    if countdown is None:
        countdown = max(0.5, min(opts.lease_seconds / 2, 30.0))
    vt = visibility_timeout(app)
    if vt is not None:
        countdown = min(countdown, vt / 2)
    ct = consumer_timeout(app, opts.celery_options.get("queue"))
    if ct is not None and ct[1]:
        countdown = min(countdown, ct[0] / 2)
    return countdown


def claimed_task(
    *, key: KeySpec, tenant: KeySpec = "", lease: float | timedelta | None = None,
    on_busy: str = "retry", max_attempts: int | None = None, busy_countdown: float | None = None,
    app: Celery | None = None, **celery_options: Any,
) -> Callable[[Callable[..., Any]], Any]:
    """Decorator: a Celery task whose body runs at most once per ``(tenant, key)``.

    - ``key``: a format string of the task's arguments (``"invoice-{order_id}"``, ``"{0}"``),
      a callable taking the task's arguments (without ``self``), or a fixed key/``TaskKey``.
    - ``tenant``: the same forms; ``""`` by default.
    - ``lease``: seconds (default ``TASKCLAIM_DEFAULT_LEASE``); renewed by keepalive while the
      body runs.
    - ``on_busy``: what a delivery does when another worker holds the task: ``"retry"``
      (publish again after ``busy_countdown`` seconds, kept below the visibility timeout),
      ``"skip"`` (drop the message; no result is stored for it), ``"wait"`` (block the worker
      slot until the task ends).
    - ``max_attempts``: claims the task may get before it ends FAILED, whatever the broker does.
    - ``app``: register with ``app.task`` instead of ``shared_task``.
    - everything else goes to Celery (``bind``, ``acks_late``, ``autoretry_for``, ``base``...).
    """
    if on_busy not in ON_BUSY:
        raise ValueError(f"on_busy must be one of {ON_BUSY}, not {on_busy!r}")
    if not (isinstance(key, str | TaskKey) or callable(key)):
        raise TypeError(f"key must be a string, a TaskKey or a callable, not {type(key).__name__}")
    if not (isinstance(tenant, str | TaskKey) or callable(tenant)):
        raise TypeError(f"tenant must be a string or a callable, not {type(tenant).__name__}")
    seconds = None if lease is None else lease_seconds(lease)
    if max_attempts is not None:
        positive_int(max_attempts, "max_attempts")  # refused here, not at the first delivery
    if busy_countdown is not None and (isinstance(busy_countdown, bool)
                                       or not isinstance(busy_countdown, int | float) or busy_countdown <= 0):
        raise ValueError(f"busy_countdown must be a positive number of seconds, not {busy_countdown!r}")

    def decorator(func: Callable[..., Any]) -> Any:
        options = dict(celery_options)
        label = options.get("name") or f"{func.__module__}.{func.__qualname__}"
        signature = inspect.signature(func)
        if options.get("bind"):
            params = list(signature.parameters.values())[1:]
            signature = signature.replace(parameters=params)
        _check_template(key, "key", signature, label)
        _check_template(tenant, "tenant", signature, label)
        base = options.pop("base", None)
        if base is None:
            base = ClaimedTask
        elif not issubclass(base, ClaimedTask):
            base = type(f"Claimed{base.__name__}", (ClaimedTask, base), {"abstract": True,
                                                                          "__module__": base.__module__})
        claim_options = ClaimOptions(
            key=key, tenant=tenant, lease=seconds, on_busy=on_busy, max_attempts=max_attempts,
            busy_countdown=None if busy_countdown is None else float(busy_countdown),
            signature=signature, celery_options=dict(celery_options), label=label,
        )
        make = app.task if app is not None else shared_task
        task = make(base=base, taskclaim=claim_options, **options)(func)
        _registry[label] = claim_options
        return task

    return decorator


# -- enqueue once ---------------------------------------------------------------------------


@dataclass
class Enqueued:
    """What :func:`enqueue_once` did: scheduled a message, or found the task already there.

    ``created`` is True when this call created the task and will publish on commit (``sent``
    turns True once the message went out; ``error`` holds a publishing failure, which
    ``reclaim --requeue`` repairs). Otherwise ``status`` says what was found.
    """

    task: Any
    created: bool
    task_id: str
    sent: bool = False
    error: BaseException | None = None

    @property
    def status(self) -> str:
        """The task's status when ``enqueue_once`` ran: ``pending``, ``running``, ``succeeded``…"""
        return str(self.task.status)

    def result(self, app: Celery | None = None) -> AsyncResult | None:
        """The ``AsyncResult`` of the message for this key (``None`` when no id is known)."""
        if not self.task_id:
            return None
        return AsyncResult(self.task_id, app=app or celery_app())


_NOT_STORED = ("eta", "countdown", "expires", "task_id")


def enqueue_once(
    task: Any, *, key: str | TaskKey, tenant: str = "", args: Iterable[Any] = (),
    kwargs: dict[str, Any] | None = None, using: str | None = None, **apply_async_options: Any,
) -> Enqueued:
    """Create the task in the caller's transaction and publish its message when it commits.

    A ``(tenant, key)`` that already exists (pending, running or finished) publishes nothing;
    the returned handle says which state it found. ``key``/``tenant`` must be the ones the
    task computes from ``args``/``kwargs``. What is needed to publish again is stored in
    ``Task.dispatch`` for ``reclaim --requeue``.
    """
    opts: ClaimOptions | None = getattr(task, "taskclaim", None)
    if not isinstance(opts, ClaimOptions):
        raise TypeError(f"enqueue_once needs a task made by claimed_task(), not {task!r}")
    args = list(args)
    kwargs = dict(kwargs or {})
    key, tenant = resolve_identity(key, tenant)
    expected = opts.identity(args, kwargs)
    if expected != (key, tenant):
        raise InvalidTaskKey(
            f"{task.name} computes key {expected[0]!r} (tenant {expected[1]!r}) from these arguments, "
            f"but enqueue_once was given {key!r} (tenant {tenant!r}); they must match"
        )
    task_id = str(apply_async_options.pop("task_id", None) or uuid())
    eta = _eta(apply_async_options)
    dispatch = {
        "task": task.name, "args": args, "kwargs": kwargs, "task_id": task_id,
        "options": {k: v for k, v in apply_async_options.items() if k not in _NOT_STORED},
        "eta": eta.isoformat() if eta else None, "sent": 1,
    }
    row, created = claims.ensure_task(key, tenant, max_attempts=opts.max_attempts, dispatch=dispatch, using=using)
    if not created:
        found = str((row.dispatch or {}).get("task_id", "")) if isinstance(row.dispatch, dict) else ""
        logger.info("enqueue_once: task exists, nothing sent",
                    extra={"key": key, "tenant": tenant, "status": row.status})
        return Enqueued(task=row, created=False, task_id=found)
    handle = Enqueued(task=row, created=True, task_id=task_id)

    def publish() -> None:
        try:
            task.apply_async(args=args, kwargs=kwargs, task_id=task_id, **apply_async_options)
        except Exception as exc:  # the row is committed PENDING: reclaim --requeue sends it later
            handle.error = exc
            logger.exception("enqueue_once: publishing failed; reclaim --requeue will send it again",
                             extra={"key": key, "tenant": tenant, "delivery_id": task_id})
            return
        handle.sent = True

    transaction.on_commit(publish, using=using or settings.DATABASE)
    return handle


def _eta(options: dict[str, Any]) -> datetime | None:
    if options.get("eta") is not None:
        eta = options["eta"]
        return eta if isinstance(eta, datetime) else None
    if options.get("countdown") is not None:
        return timezone.now() + timedelta(seconds=float(options["countdown"]))
    return None


# -- requeue lost messages ---------------------------------------------------------------------


@dataclass
class Requeued:
    task_id: int
    key: str
    tenant: str
    celery_task_id: str
    error: BaseException | None = None


def requeue_lost(
    reclaimed: Iterable[Sequence[Any]] = (), *, older_than: float | None = REQUEUE_AFTER,
    limit: int | None = None, app: Celery | None = None, using: str | None = None, dry_run: bool = False,
) -> list[Requeued]:
    """Publish again the messages of bridge-enqueued tasks that nobody is going to run.

    - ``reclaimed``: rows returned by ``reclaim_expired_rows`` (``id, key, tenant, token,
      status``); those back in PENDING are sent again at once.
    - ``older_than``: PENDING tasks whose message was last sent more than this many seconds
      ago (and whose ETA has passed) are sent again; ``None`` skips this sweep.

    Each re-send first moves ``updated_at`` on in a guarded update, so two sweepers never
    send the same task twice in one round. A duplicate message is harmless anyway: the
    claim turns it into a duplicate delivery.

    ``dry_run``: change and send nothing; return what would be sent (``reclaimed`` may then
    list expired tasks that a reclaim *would* move back to pending).
    """
    from .models import Task as TaskRow

    using = using or settings.DATABASE
    rows = TaskRow.objects.using(using)
    picked: list[tuple[Any, Any]] = []  # (task, guard filter)
    status = {} if dry_run else {"status": "pending"}
    for r in reclaimed:
        if r[4] != "pending":
            continue
        task = rows.filter(pk=r[0], fencing_token=r[3], dispatch__isnull=False, **status).first()
        if task is not None:
            picked.append((task, {"fencing_token": r[3]}))
    if older_than is not None:
        # The database's clock, like updated_at itself: a sweeper's own clock may be off.
        cutoff = DbNowPlus(-older_than)
        stale = rows.filter(status="pending", dispatch__isnull=False, updated_at__lt=cutoff).order_by("id")
        seen = {t.pk for t, _ in picked}
        for task in stale[:limit] if limit else stale:
            if task.pk not in seen and not _eta_ahead(task.dispatch):
                picked.append((task, {"updated_at__lt": cutoff}))
    if limit:
        picked = picked[:limit]
    if dry_run:
        return [Requeued(task.pk, task.key, task.tenant, str(task.dispatch.get("task_id") or ""))
                for task, _ in picked if isinstance(task.dispatch, dict) and task.dispatch.get("task")]
    app = app or celery_app()
    done = []
    for task, guard in picked:
        dispatch = dict(task.dispatch) if isinstance(task.dispatch, dict) else {}
        name = dispatch.get("task")
        if not name:
            continue
        dispatch["sent"] = int(dispatch.get("sent", 1)) + 1
        moved = rows.filter(pk=task.pk, status="pending", **guard).update(updated_at=DbNow(), dispatch=dispatch)
        if not moved:
            continue  # claimed or re-sent by someone else meanwhile
        item = Requeued(task.pk, task.key, task.tenant, str(dispatch.get("task_id") or ""))
        try:
            _publish(app, name, dispatch)
        except Exception as exc:  # counted and reported by the caller; the next round tries again
            item.error = exc
            logger.exception("requeue failed", extra={"key": task.key, "tenant": task.tenant})
        else:
            logger.info("lost message re-sent", extra={"key": task.key, "tenant": task.tenant,
                                                       "delivery_id": item.celery_task_id})
        done.append(item)
    return done


def _eta_ahead(dispatch: Any) -> bool:
    eta = dispatch.get("eta") if isinstance(dispatch, dict) else None
    if not eta:
        return False
    try:
        when = datetime.fromisoformat(eta)
    except ValueError:
        return False
    return when > timezone.now()


def _publish(app: Celery, name: str, dispatch: dict[str, Any]) -> None:
    options = dict(dispatch.get("options") or {})
    task_id = dispatch.get("task_id") or None
    if name in app.tasks:
        app.tasks[name].apply_async(args=dispatch.get("args") or (), kwargs=dispatch.get("kwargs") or {},
                                    task_id=task_id, **options)
    else:
        app.send_task(name, args=dispatch.get("args") or (), kwargs=dispatch.get("kwargs") or {},
                      task_id=task_id, **options)


__all__ = [
    "ClaimOptions", "ClaimedTask", "Enqueued", "Requeued", "broker_scheme", "busy_countdown", "celery_app",
    "claimed_task", "claimed_tasks", "consumer_timeout", "enqueue_once", "import_task_modules", "in_use",
    "queue_arguments", "requeue_lost", "visibility_timeout",
]
