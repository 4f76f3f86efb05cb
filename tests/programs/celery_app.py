"""The Celery app of the test suite, configured from ``tests/settings.py`` (``CELERY_*``).

Worker processes run ``celery -A tests.programs.celery_app worker``; the tests publish with the same
app after pointing ``broker_url``/``result_backend`` at their servers. The result backend is
always their Redis server; the broker is Redis or RabbitMQ (``TASKCLAIM_TEST_BROKER_URL`` in a
worker's environment, an ``amqp://`` URL, overrides the Redis broker of ``tests/settings.py``). Tasks made in the
``app.task`` style live here, tasks in the ``shared_task`` style in ``tests.programs.celery_tasks``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery

from django_taskclaim.celery import claimed_task

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

app = Celery("taskclaim_tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.include = ["tests.programs.celery_tasks"]
if os.environ.get("TASKCLAIM_TEST_BROKER_URL"):
    app.conf.broker_url = os.environ["TASKCLAIM_TEST_BROKER_URL"]


def quorum_queue(name: str, delivery_limit: int) -> object:
    """A RabbitMQ quorum queue that dead-letters a message returned more than ``delivery_limit``
    times into the classic queue ``<name>-dead`` (where a test can count it)."""
    from kombu import Queue

    return Queue(name, queue_arguments={
        "x-queue-type": "quorum", "x-delivery-limit": delivery_limit,
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{name}-dead"})


if os.environ.get("TASKCLAIM_TEST_QUORUM_QUEUE"):  # "name:limit", for a worker that reads it
    _name, _limit = os.environ["TASKCLAIM_TEST_QUORUM_QUEUE"].split(":")
    app.conf.task_queues = [quorum_queue(_name, int(_limit))]

LEASE = 2.0


@contextmanager
def app_conf(**values: Any) -> Iterator[None]:
    """Change the test app's configuration for a block, as ``override_settings`` does for Django's."""
    old = {name: app.conf[name] for name in values}
    app.conf.update(values)
    try:
        yield
    finally:
        app.conf.update(old)


def point_at(broker_url: str | None, result_backend: str | None) -> None:
    """Point the app at other servers, dropping every connection it built for the old ones.

    Celery caches a connection pool (``app._pool``), a producer pool (``app.amqp``) and a
    result backend on first use (e.g. by an in-process test); the pools also stay registered
    in kombu's process-wide pool groups, keyed by URL. Closing a pool without unregistering
    it left a closed pool that pointing back at the same URL found again ("Acquire on closed
    pool"): ``kombu.pools.reset()`` closes them all and empties the groups.
    """
    from kombu import pools

    pools.reset()
    app._pool = None
    app.amqp._producer_pool = None
    app._backend_cache = None  # a thread-safe backend is cached here, others per thread
    vars(app._local).pop("backend", None)
    app.conf.update(broker_url=broker_url, result_backend=result_backend)


@claimed_task(key="work-{name}", lease=LEASE, busy_countdown=0.3, max_attempts=5, app=app, bind=True)
def work(self, name: str, seconds: float = 0.0) -> dict[str, object]:
    """Simulated work of ``seconds``, then one Effect row written under the claim's fence."""
    from tests.testapp.models import Effect

    claim = self.claim
    if seconds:
        time.sleep(seconds)  # the work itself: the window that pauses, kills and timeouts hit
    with claim.fenced():
        Effect.objects.create(task_key=claim.key, token=claim.token, worker=f"{os.getpid()}")
    return {"name": name, "token": claim.token, "pid": os.getpid()}


def _hold(self: object, name: str, timeout: float) -> dict[str, object]:
    """Runs until the test writes an Effect row ``release:<key>`` (or ``timeout``), then one
    Effect row under the fence: a task as long as the test needs, without a fixed sleep."""
    from tests.testapp.models import Effect

    claim = self.claim  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while not Effect.objects.filter(task_key=f"release:{claim.key}").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{claim.key} was never released")
        time.sleep(0.1)  # poll interval
    with claim.fenced():
        Effect.objects.create(task_key=claim.key, token=claim.token, worker=f"{os.getpid()}")
    return {"name": name, "token": claim.token, "pid": os.getpid()}


@claimed_task(key="hold-{name}", lease=LEASE, busy_countdown=0.3, app=app, bind=True)
def hold(self, name: str, timeout: float = 120.0) -> dict[str, object]:
    """Held until released by the test; a busy delivery retries (``on_busy="retry"``)."""
    return _hold(self, name, timeout)


@claimed_task(key="hold-skip-{name}", lease=LEASE, on_busy="skip", app=app, bind=True)
def hold_skip(self, name: str, timeout: float = 120.0) -> dict[str, object]:
    """Held until released by the test; a busy delivery is dropped (``on_busy="skip"``)."""
    return _hold(self, name, timeout)


@claimed_task(key="hold-wait-{name}", lease=LEASE, on_busy="wait", app=app, bind=True)
def hold_wait(self, name: str, timeout: float = 120.0) -> dict[str, object]:
    """Held until released by the test; a busy delivery blocks its slot (``on_busy="wait"``)."""
    return _hold(self, name, timeout)


@claimed_task(key="poison-{name}", lease=1, on_busy="wait", max_attempts=3, app=app, bind=True)
def kills_its_worker(self, name: str) -> None:
    """A poison message: each execution records an Effect, then its worker child dies."""
    import signal

    from tests.testapp.models import Effect

    Effect.objects.create(task_key=self.claim.key, token=self.claim.token, worker=f"{os.getpid()}")
    os.kill(os.getpid(), signal.SIGKILL)


def _record_refusals(**kwargs: object) -> None:
    """In worker processes only: note each fenced-off write as an Effect row ``refused:<key>``."""
    from django_taskclaim import signals

    def refused(sender: object, key: str, action: str, token: int, **extra: object) -> None:
        from tests.testapp.models import Effect

        Effect.objects.create(task_key=f"refused:{key}", token=token, worker=action)

    signals.stale_write_refused.connect(refused, weak=False, dispatch_uid="tests-record-refusals")


def _connect_worker_signals() -> None:
    from celery.signals import worker_process_init

    worker_process_init.connect(_record_refusals, weak=False)


_connect_worker_signals()
