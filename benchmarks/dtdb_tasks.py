"""The no-op task that django-tasks-db's worker drains (imported by the worker by path)."""

from __future__ import annotations

try:
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from django_tasks import task  # type: ignore[import-not-found,no-redef,unused-ignore]

# Executions seen by this worker process, to count duplicates across workers.
EXECUTED: list[int] = []


@task()
def noop(i: int) -> None:
    EXECUTED.append(i)
