"""Tasks of a newer release than a worker's: where ``TASKCLAIM_TEST_OLD_RELEASE`` is set (a worker
of the previous release, during a rolling deploy) this module does not exist yet."""

from __future__ import annotations

import os

from django_taskclaim import TaskKey
from django_taskclaim.tasks import keyed

try:
    from django.tasks import task  # type: ignore[attr-defined,unused-ignore]
except ImportError:
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]

if os.environ.get("TASKCLAIM_TEST_OLD_RELEASE"):
    raise ModuleNotFoundError(f"No module named {__name__!r}", name=__name__)


@task()
@keyed(lambda n: TaskKey("new-report", run=str(n)))
def report(n: int) -> dict[str, int]:
    return {"report": n}
