"""Prepared statements under Django's connection pool and server-side binding (PostgreSQL).

Each test runs a worker process in the named configuration (tests/settings.py) against the
test database: 40 claim + complete cycles, each ended like a request (the connection closed,
with a pool: handed back, so the next cycle may run on another server session).
"""

from __future__ import annotations

import json

import pytest
from django.db import connection

from django_taskclaim.models import Task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(autouse=True)
def _postgresql_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")


def run_cycles(spawn, config: str, prepared: bool, n: int = 40) -> dict:  # type: ignore[no-untyped-def]
    proc = spawn("cycles", "--n", str(n), "--prefix", config,
                 env={"TASKCLAIM_TEST_CONFIG": config, "TASKCLAIM_TEST_PREPARED": "1" if prepared else "0"})
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("config", ["pool", "server_side_binding"])
@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "plain"])
def test_claim_complete_cycles_all_succeed(spawn, config: str, prepared: bool) -> None:  # type: ignore[no-untyped-def]
    # Before the fix, with prepared statements on: the pool failed 37 of 40 cycles ("prepared
    # statement … already exists"), server-side binding all 40 ("could not determine data type
    # of parameter $1").
    report = run_cycles(spawn, config, prepared)
    assert (report["ok"], report["failed"]) == (40, 0), report["errors"]
    assert Task.objects.filter(key__startswith=f"{config}-", status="succeeded").count() == 40

