"""Which statements the PostgreSQL store sends name the tenant: what docs/scaling.md says of Citus.

With Citus and ``tenant`` as the distribution column, a statement goes whole to the one node of a
tenant only when it names that tenant (an equality in its WHERE, or the value it inserts). The
claim by key, a duplicate's read, ``ensure()`` and a tenant's queue claim do; an owner's writes
(by id and token), a claim of any tenant's work, the sweeper and the operators' actions do not.
Routing by ``TASKCLAIM_ROUTER`` does not need them to (each goes to ``claim.using``); Citus would.
This test records every statement of each operation, so that the page stays true.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from django_taskclaim.models import Task
from tests.conftest import expire

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="Citus is PostgreSQL: its store's statements"),
]

NAMES_TENANT = re.compile(r"\btenant = %s|INSERT INTO django_taskclaim_task \(tenant,")


def statements(operation: Callable[[], Any]) -> list[str]:
    """The statements ``operation`` sends to the task database, in order."""
    sent: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        operation()
    return sent


def names_tenant(operation: Callable[[], Any]) -> list[bool]:
    """For each statement ``operation`` sends: whether it names the tenant."""
    return [NAMES_TENANT.search(sql) is not None for sql in statements(operation)]


def test_what_names_the_tenant_and_what_does_not() -> None:
    held: dict[str, Any] = {}

    def claim() -> None:
        held["claim"] = Task.objects.claim("k", tenant="t").claim

    def fenced() -> None:
        with held["claim"].fenced():
            pass

    # Every statement of these names the tenant (single-shard with Citus):
    assert all(names_tenant(claim))  # a new task
    assert all(names_tenant(lambda: Task.objects.claim("k", tenant="t")))  # a duplicate, recorded
    assert all(names_tenant(lambda: Task.objects.ensure("q", tenant="t", queue="default")))
    queued: list[Any] = []
    assert all(names_tenant(lambda: queued.extend(Task.objects.claim_next(tenant="t"))))
    # An owner's writes go by (id, token): none names the tenant.
    claim_ = held["claim"]
    for write in (claim_.heartbeat, claim_.check, fenced, claim_.release):
        assert not any(names_tenant(write)), write
    claim()
    assert not any(names_tenant(lambda: held["claim"].fail("x", retry=True)))
    claim()
    assert not any(names_tenant(lambda: held["claim"].complete("done")))
    # A completion that claims the next task of a tenant: one statement, its completion by id.
    next_sql = statements(lambda: queued[0].complete_and_claim_next(tenant="t"))
    assert len(next_sql) == 1 and "WHERE django_taskclaim_task.id = %s" in next_sql[0]
    # Work of any tenant, the sweeper and the operators' actions: every tenant, by design.
    Task.objects.ensure("q2", tenant="u", queue="default")
    assert not any(names_tenant(lambda: Task.objects.claim_next()))
    expire(Task.objects.get(key="q2"))
    assert not any(names_tenant(Task.objects.reclaim_expired))
    for action in ("force_release", "cancel", "reset"):
        assert not any(names_tenant(lambda action=action: getattr(Task.objects.filter(key="q2"), action)()))
