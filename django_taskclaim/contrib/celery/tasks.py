"""``@claimed_task``: a Celery task whose body runs under a claim, with keepalive, and whose
duplicate deliveries read the stored result (or wait, retry, skip while it runs)."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import celery
from celery import Celery, shared_task
from celery.exceptions import Ignore, Reject, Retry
from django.core.exceptions import ImproperlyConfigured

from ... import claims
from ...claims import Claim
from ...exceptions import StaleClaim, TaskFailed
from ...execution import (
    WAIT,
    Policy,
    conclude,
    current_claim_or_none,
    execute,
    run_by_key,
)
from ...identity import TaskKey
from ...status import Status
from ...values import lease_seconds, positive_int
from .broker import consumer_timeout, visibility_timeout
from .options import ON_BUSY, ClaimOptions, KeySpec, _check_template, register

logger = logging.getLogger("django_taskclaim")


def _retries(error: BaseException) -> bool:
    """Celery decides retries: its ``Retry`` (autoretry, ``self.retry()``) and a requeued ``Reject``."""
    return isinstance(error, Retry) or (isinstance(error, Reject) and bool(error.requeue))


def _recorded(error: BaseException) -> BaseException | str:
    """What is stored for a failure: the exception a ``Retry`` carries, a ``Reject``'s reason."""
    if isinstance(error, Retry):
        return error.exc or error.message or "retry requested"
    if isinstance(error, Reject):
        return error.reason or "rejected"
    return error


# Celery retries what it decides to (autoretry and self.retry() raise Retry); any other error
# is final. Ignore releases the claim untouched, as a shutdown does.
POLICY = Policy(retry=_retries, release_on=(Ignore,), error=_recorded)
#: A ``self.retry()`` that Celery will not carry out (its ``max_retries`` spent, a direct call):
#: recorded as the task's final failure.
GIVING_UP = dataclasses.replace(POLICY, retry=False)


class ClaimedTask(celery.Task):
    """Base class of tasks made by :func:`claimed_task`; its ``__call__`` runs the body under a claim.

    A custom base passed as ``base=`` is combined with this one.
    """

    abstract = True
    taskclaim: ClaimOptions | None = None

    @property
    def claim(self) -> Claim:
        """The claim the body runs under (for ``self.claim.fenced()``, ``.check()``, ``.key``)."""
        claim = current_claim_or_none()
        if claim is None:
            raise RuntimeError(f"{self.name}.claim is only available while the task body runs")
        return claim

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
        opts = self._options()
        key, tenant = opts.identity(args, kwargs)
        request = self.request
        delivery_id = str(request.id or "")
        # Direct and eager calls cannot re-publish themselves: they wait instead of "retry".
        direct = bool(request.called_directly or request.is_eager)

        def run(claim: Claim) -> Any:
            # Fenced off (another worker took over): from here on a duplicate, answered by run_by_key.
            return execute(claim, self.run, args, kwargs, policy=POLICY).outcome()

        def busy(task: Any) -> Any:
            if opts.on_busy == "skip":
                logger.info("duplicate delivery skipped: key=%r tenant=%r", key, tenant,
                            extra={"key": key, "tenant": tenant, "delivery_id": delivery_id})
                raise Ignore()
            if opts.on_busy == "retry" and not direct:
                raise self._busy_retry(task, opts)
            return WAIT

        return run_by_key(lambda: claims.claim(key, tenant, lease=opts.lease, max_attempts=opts.max_attempts,
                                                  delivery_id=delivery_id), run, busy)

    def retry(self, args: Any = None, kwargs: Any = None, exc: BaseException | None = None,
              throw: bool = True, eta: Any = None, countdown: Any = None,
              max_retries: int | None = None, **options: Any) -> Any:
        """Celery's retry, in step with the database: the attempt is recorded first, by the one
        rule every failure goes through (``conclude``), before Celery publishes the retry.

        When Celery will retry, the task goes back to PENDING unless its ``max_attempts`` are
        spent, in which case it ends FAILED and no retry is published. When Celery gives up
        (``max_retries``), the task ends FAILED. Fenced off, nothing is published: from here on
        the delivery is a duplicate.
        """
        claim = current_claim_or_none()
        if claim is None or claim.ended() is not None:
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)
        request = self.request
        limit = self.max_retries if max_retries is None else max_retries
        celery_retries = not request.called_directly and not (
            limit is not None and request.retries + 1 > limit)
        # Recorded as if the body raised the Retry now: its exc (or "retry requested") is the error.
        executed = conclude(claim, raised=Retry(exc=exc), policy=POLICY if celery_retries else GIVING_UP)
        if executed.fenced_off:
            raise StaleClaim(claim.key, claim.tenant, claim.token, "retry")
        if celery_retries and executed.ending != Status.PENDING:
            logger.info("max_attempts reached, not retrying: %s", claim.named(), extra=claim.log_extra())
            if exc is not None:
                raise exc
            from ...models import Task

            raise TaskFailed(Task.objects.using(claim.using).get(pk=claim.task_id))
        return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)

    def _busy_retry(self, task: Any, opts: ClaimOptions) -> Retry:
        """Publish this message again after a short countdown, without using up ``max_retries``."""
        countdown = busy_countdown(opts, self.app)
        request = self.request
        sig = self.signature_from_request(request, None, None, countdown=countdown, retries=request.retries)
        sig.apply_async()
        logger.info("task busy: checking again in %.1fs: key=%r tenant=%r owner=%r", countdown, task.key, task.tenant,
                    task.owner,
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
        register(label, claim_options)
        return task

    return decorator
