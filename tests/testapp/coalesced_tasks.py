"""Coalesced Django tasks of the test suite (tests/integrations/django_tasks/test_django_tasks_coalescing.py,
tests/processes/test_coalescing_processes.py)."""

from __future__ import annotations

from typing import Any

from django_taskclaim.tasks import claim_options, coalesced, current_claim

try:
    from django.tasks import task  # type: ignore[attr-defined,unused-ignore]
except ImportError:
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]


@task()
@coalesced(lambda doc_id, version=None: f"reindex:{doc_id}")
def reindex(doc_id: int, version: Any = None) -> dict[str, Any]:
    """Re-index one document: enqueues of one document while it waits are one run, the newest version's."""
    return {"doc": doc_id, "version": version, "token": current_claim().token}


@task()
@coalesced(lambda doc_id, version=None: f"debounced:{doc_id}", delay=30, max_delay=60)
def debounced(doc_id: int, version: Any = None) -> Any:
    """Waits 30 s after the latest enqueue, never more than 60 s after the first."""
    return version


@task()
@coalesced(lambda doc_id: f"capped:{doc_id}", delay=30, max_delay=30)
def capped(doc_id: int) -> int:
    """Waits 30 s after the first enqueue, whatever comes later."""
    return doc_id


@task()
@coalesced(lambda value: value)
def grouped_by_value(value: Any) -> Any:
    """The group is the argument itself: any value reaches the group's checks."""
    return value


@task()
@coalesced(lambda doc_id, version=None: f"serial:{doc_id}")
@claim_options(concurrency_key=lambda doc_id, version=None: f"serial:{doc_id}", concurrency_limit=1)
def serial_reindex(doc_id: int, version: Any = None) -> Any:
    """Coalesced, and one run of a document at a time: the follow-up waits while its predecessor runs."""
    return version
