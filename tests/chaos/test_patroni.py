"""Failover decided by a real HA manager: Patroni (with etcd), three members on 127.0.0.1.

``devtools.patroni.PatroniCluster`` starts Debian's ``etcd`` and three ``patroni`` agents (no
service manager; data under a temporary folder). The leader's machine is SIGKILLed (its agent and
its PostgreSQL); Patroni promotes a replica once the leader key expires in etcd. Django processes
reach the leader through the multi-host setting with ``target_session_attrs=read-write``, and the
claims after the failover get tokens above every token before it (the new leader's timeline is a
new epoch), with ``synchronous_mode`` off and on.

PostgreSQL leg only; skipped where Patroni or etcd is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator

import pytest

from devtools.patroni import PatroniCluster
from tests.chaos.test_chaos import require_binaries
from tests.chaos.test_epoch_failover import claim, django

DB = os.environ.get("TASKCLAIM_TEST_DB", "sqlite")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(DB != "postgresql", reason="Patroni runs PostgreSQL (the PostgreSQL leg)"),
]


@pytest.fixture(params=[False, True], ids=["async", "synchronous_mode"])
def cluster(request: pytest.FixtureRequest) -> Iterator[PatroniCluster]:
    require_binaries()
    if shutil.which("patroni") is None or shutil.which("etcd") is None:
        from tests.conftest import requirement_missing
        requirement_missing("patroni and etcd (apt-get install patroni etcd-server)")
    with PatroniCluster(synchronous=request.param) as servers:
        yield servers


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_patroni_fails_over_and_no_token_is_granted_again(cluster: PatroniCluster, how: str) -> None:
    """The leader's machine SIGKILLed, or SIGSTOPped (hung: its connections hang rather than
    reset) and killed once Patroni has promoted another member."""
    django(cluster, "migrate", "--verbosity", "0")
    before = [claim(cluster, f"job{i}", "old", release=True)["token"] for i in range(3)]
    assert before == [1, 1, 1]
    epoch = json.loads(django(cluster, "taskclaim_epoch", "--json"))["databases"]["default"]
    assert epoch["timeline"] == 1
    # The tables and the first tokens on every member before the fault: a replica promoted while it
    # still lagged behind the migration would have no task table (seen once under CI's load).
    cluster.wait_replicated()

    old, new, killed, promoted = cluster.fail_over(how=how)
    first = claim(cluster, "job0", "new")  # through the multi-host setting: the new leader
    first_claim = time.time() - killed
    assert first["claimed"] and first["token"] > max(before)
    after = json.loads(django(cluster, "taskclaim_epoch", "--json"))["databases"]["default"]
    assert after["timeline"] >= 2 and first["token"] >= after["first_token"]
    assert new.state().get("timeline", 0) >= 2
    print(f"patroni failover ({'sync' if cluster.synchronous else 'async'}, {how}): {old.name} -> {new.name}, "
          f"promoted {promoted - killed:.1f} s after the kill, first claim {first_claim:.1f} s")
