"""The no-op task the Tasks-framework workers drain, imported by them by its path: django-tasks-db's
in the queue-drain phase, every system's in the Django Tasks phase (bound to the ``default``
backend of whichever settings the process runs with)."""

from __future__ import annotations

try:
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from django_tasks import task  # type: ignore[import-not-found,no-redef,unused-ignore]

# Executions seen by this worker process (by any of its threads), to count duplicates across workers.
EXECUTED: list[int] = []


@task()
def noop(i: int) -> None:
    EXECUTED.append(i)


@task()
def stamp(i: int) -> None:
    """The latency phase's task: write the time it started to the file ``i`` in the folder
    ``TASKCLAIM_BENCH_STAMPS`` (whole, by a rename), where the enqueuing process reads it."""
    import os
    import time
    from pathlib import Path

    started = time.time()
    path = Path(os.environ["TASKCLAIM_BENCH_STAMPS"]) / str(i)
    path.with_suffix(".part").write_text(repr(started))
    path.with_suffix(".part").rename(path)
