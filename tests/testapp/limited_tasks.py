"""Django tasks with concurrency limits (``claim_options(concurrency_key=..., concurrency_limit=...)``):
tests/integrations/django_tasks/test_django_tasks_limits.py, tests/processes/test_limits_processes.py."""

from __future__ import annotations

import time

from django_taskclaim.tasks import claim_options, current_claim

try:
    from django.tasks import task  # type: ignore[attr-defined,unused-ignore]
except ImportError:
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]

from .models import Span


@task()
@claim_options(concurrency_key=lambda account, hold=0.0: f"api:{account}", concurrency_limit=2)
def call_api(account: str, hold: float = 0.0) -> str:
    """At most two calls per account at once; records when its body ran (a sleep stands for the call)."""
    started = time.time_ns() // 1000
    time.sleep(hold)
    Span.objects.create(task_key=current_claim().key, started_us=started, ended_us=time.time_ns() // 1000)
    return account


@task()
@claim_options(concurrency_key="reports", concurrency_limit=1)
def build_report(n: int) -> int:
    """One report at a time, whatever its arguments."""
    return n


@task()
@claim_options(concurrency_key="solo", concurrency_limit=1)
def solo(name: str) -> str:
    """One at a time; marks its start (and holds on its first attempt where the test asks: tasks._mark)."""
    from .tasks import _mark

    started = time.time_ns() // 1000
    _mark(name)
    Span.objects.create(task_key=name, started_us=started, ended_us=time.time_ns() // 1000)
    return name
