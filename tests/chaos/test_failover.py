"""Primary failover: a PostgreSQL primary with a standby, the primary SIGKILLed, the standby promoted.

The servers are Debian's PostgreSQL binaries started here (``devtools.replication.PostgresPair``),
on 127.0.0.1. What the failover guarantee rests on is tested first, on the pair alone (a
synchronous standby has every acknowledged commit; an asynchronous one that lags does not),
then what Django needs (a multi-host ``HOST``/``PORT`` and ``target_session_attrs``), then the
short form of ``python -m tests.chaos --faults failover`` (docs/fault-injection.md): workers
claiming and completing while the primary is killed, checked by the harness's checker.

PostgreSQL leg only: the other legs have no standby to promote.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.polling import wait_until
from devtools.replication import PostgresPair
from tests.chaos.test_chaos import chaos, require_binaries

DB = os.environ.get("TASKCLAIM_TEST_DB", "sqlite")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(DB != "postgresql", reason="failover needs PostgreSQL servers (the PostgreSQL leg)"),
]


@pytest.fixture
def pair(request: pytest.FixtureRequest) -> Iterator[PostgresPair]:
    require_binaries()
    options = getattr(request, "param", {})
    with PostgresPair(**options) as servers:
        servers.primary.sql("CREATE TABLE acknowledged (mark text PRIMARY KEY)")
        wait_until(lambda: servers.standby.sql("SELECT to_regclass('acknowledged') IS NOT NULL") == "t",
                   timeout=30, what="the table on the standby")
        yield servers


def commit_then_fail_over(pair: PostgresPair) -> tuple[str, str]:
    """Commit one row on the primary (psql returns once the commit is acknowledged), fail over
    at once; the row's mark, and what the new primary has of it."""
    mark = uuid.uuid4().hex
    pair.primary.sql("INSERT INTO acknowledged VALUES (:'mark')", mark=mark)
    pair.failover()
    return mark, pair.primary.sql("SELECT string_agg(mark, ',') FROM acknowledged WHERE mark = :'mark'",
                                  mark=mark)


@pytest.mark.parametrize("pair", [{"synchronous": True, "lag": 0.5}], indirect=True)
def test_a_synchronous_standby_has_every_acknowledged_commit(pair: PostgresPair) -> None:
    """The standby receives the WAL half a second late, and the commit waits for it: the row is on
    the standby when the primary dies, and on the new primary after the promotion."""
    mark, found = commit_then_fail_over(pair)
    assert found == mark
    assert pair.primary.sql("SELECT pg_is_in_recovery()") == "f"
    assert pair.standby.sql("SELECT pg_is_in_recovery()") == "t"  # rebuilt from the new primary
    assert pair.primary.sql("SELECT sync_state FROM pg_stat_replication") == "sync"


@pytest.mark.parametrize("pair", [{"synchronous": False, "lag": 0.5}], indirect=True)
def test_an_asynchronous_standby_loses_what_it_had_not_received(pair: PostgresPair) -> None:
    """The same with the standby asynchronous: the commit is acknowledged by the primary alone,
    which dies before the standby received it; the promoted standby never heard of the row."""
    mark, found = commit_then_fail_over(pair)
    assert found == ""
    assert pair.primary.sql("SELECT count(*) FROM acknowledged") == "0"


def test_django_reaches_the_primary_through_a_multi_host_setting(
        pair: PostgresPair, monkeypatch: pytest.MonkeyPatch, django_db_blocker: Any) -> None:
    """Django's PostgreSQL backend hands ``HOST``/``PORT`` lists and ``OPTIONS`` to psycopg as
    they are: with ``target_session_attrs = "read-write"`` a connection skips the standby
    listed first, and after a failover the next connection finds the promoted server."""
    from django.db.utils import ConnectionHandler

    monkeypatch.delenv("PGTARGETSESSIONATTRS", raising=False)  # only the setting under test
    standby_first = {
        "ENGINE": "django.db.backends.postgresql", "NAME": "postgres", "USER": "postgres",
        "HOST": "127.0.0.1,127.0.0.1", "PORT": f"{pair.standby.port},{pair.primary.port}",
    }
    handler = ConnectionHandler({
        "default": {**standby_first, "OPTIONS": {"target_session_attrs": "read-write"}},
        "plain": standby_first,
    })

    def where(alias: str) -> tuple[bool, int]:
        with handler[alias].cursor() as cursor:
            cursor.execute("SELECT pg_is_in_recovery(), inet_server_port()")
            in_recovery, port = cursor.fetchone()
        return in_recovery, port

    # Connections of a handler of its own to the pair, not the suite's test database.
    with django_db_blocker.unblock():
        try:
            assert where("plain") == (True, pair.standby.port)  # the first host that answers
            assert where("default") == (False, pair.primary.port)
            pair.failover()
            handler["default"].close()
            assert where("default") == (False, pair.primary.port)  # the promoted node, listed first
        finally:
            handler.close_all()


def test_short_failover_run_loses_nothing(tmp_path: Path) -> None:
    """The CI form of the 5-minute run: workers claim and complete while the primary is killed
    and the synchronous standby promoted (twice where the machine lets the first end in time: at least
    once); every commit a worker saw is on the last primary."""
    require_binaries()
    code, out, report = chaos(
        tmp_path, "--faults", "failover", "--duration", "14", "--workers", "3", "--seed", "27",
        "--failover-interval", "4", timeout=240)
    assert code == 0, out
    assert report["ok"] and not report["violations"] and report["replication"] == "sync", out
    assert report["faults"]["failover"] >= 1, out
    assert all(row["first_claim"] is not None for row in report["failovers"]), out
    figures = report["figures"]
    assert figures["claims_seen"] >= figures["tasks_enqueued"] > 0, out
    assert figures["effects_accepted"] == figures["tasks_enqueued"], out
    for name in ("lost", "duplicated", "claims_lost", "effects_lost", "tokens_reused", "tokens_went_down",
                 "standby_writes"):  # the last: no connection landed on the standby
        assert figures[name] == 0, f"{name}\n{out}"


def test_short_failover_run_with_an_asynchronous_standby_is_caught_losing(tmp_path: Path) -> None:
    """The checker is not a rubber stamp for failover either: with the standby asynchronous and
    0.2 s behind, each failover forgets what the workers were told had committed, and
    the checker reports it (exit status 1, the losses listed) instead of failing itself. No token
    is granted twice all the same: the epoch of the promoted standby's timeline is larger."""
    require_binaries()
    code, out, report = chaos(
        tmp_path, "--faults", "failover", "--replication", "async", "--standby-lag", "0.2",
        "--duration", "14", "--workers", "3", "--seed", "28", "--failover-interval", "3", timeout=240)
    assert code == 1 and "Traceback" not in out, out
    figures = report["figures"]
    # At least one failover: on a loaded machine the first can take seconds to become writable,
    # leaving no time for a second within the run (one with the standby behind loses already).
    assert report["faults"]["failover"] >= 1, out
    assert figures["claims_lost"] + figures["effects_lost"] + figures["lost"] > 0, out
    assert "FAIL" in out, out
    # What the lost commits do not bring back: a token. Each claim lost with the old primary had
    # a token of its timeline's epoch; the promoted standby's are above it (DESIGN §13).
    assert figures["tokens_reused"] == figures["tokens_went_down"] == 0, out


def test_short_failover_run_under_patroni_grants_no_token_twice(tmp_path: Path) -> None:
    """The CI form of ``--ha patroni``: Patroni (etcd, three members, no synchronous_mode) decides the
    failover after the leader's machine is SIGKILLed; the workers follow the leader through the
    multi-host setting. Whatever an asynchronous replica may lack, no token is granted twice."""
    import shutil

    require_binaries()
    if shutil.which("patroni") is None or shutil.which("etcd") is None:
        from tests.conftest import requirement_missing
        requirement_missing("patroni and etcd (apt-get install patroni etcd-server)")
    code, out, report = chaos(
        tmp_path, "--faults", "failover", "--ha", "patroni", "--replication", "async", "--duration", "16",
        "--workers", "2", "--seed", "29", "--failover-interval", "4", timeout=420)
    assert code in (0, 1) and "Traceback" not in out and report, out  # 1: a commit lost, reported as such
    assert report["faults"]["failover"] >= 1, out
    assert all(row["first_claim"] is not None for row in report["failovers"]), out
    figures = report["figures"]
    for name in ("tokens_reused", "tokens_went_down", "standby_writes"):
        assert figures[name] == 0, f"{name}\n{out}"

