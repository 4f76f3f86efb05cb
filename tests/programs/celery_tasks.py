"""Claimed tasks in the ``shared_task`` style (registered with every app, the test app included)."""

from __future__ import annotations

import os

from django_taskclaim.celery import claimed_task


class Boom(RuntimeError):
    pass


@claimed_task(key="{0}", max_attempts=3, lease=5, autoretry_for=(Boom,), max_retries=None,
              default_retry_delay=0, retry_backoff=False)
def always_fails(key: str) -> None:
    """Writes one Effect per execution, then fails; Celery would retry it forever."""
    from tests.testapp.models import Effect

    Effect.objects.create(task_key=key, token=0, worker=str(os.getpid()))
    raise Boom(f"attempt failed in {os.getpid()}")


@claimed_task(key=lambda name, value=None: f"echo-{name}", on_busy="skip", bind=True)
def echo(self, name: str, value: object = None) -> object:
    """Returns ``value``; records which claim ran it."""
    from tests.testapp.models import Effect

    with self.claim.fenced():
        Effect.objects.create(task_key=self.claim.key, token=self.claim.token, worker=str(os.getpid()))
    return value


@claimed_task(key="{0}", max_attempts=3, lease=5, autoretry_for=(Boom,), max_retries=None,
              default_retry_delay=0, retry_backoff=False, bind=True)
def stepped(self, key: str) -> list[str]:
    """Two durable steps (``self.claim.step``), each writing one Effect when it runs; the first
    attempt fails between them, and Celery retries it."""
    from tests.testapp.models import Effect

    def call(name: str) -> str:
        Effect.objects.create(task_key=f"{key}:{name}", token=self.claim.token, worker=str(os.getpid()))
        return name

    first = self.claim.step("first", call, "first")
    if self.claim.attempt == 1:
        raise Boom("fails after its first step")
    return [first, self.claim.step("second", call, "second")]
