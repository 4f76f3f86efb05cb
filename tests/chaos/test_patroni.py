"""Failover decided by a real HA manager: Patroni (with etcd), three members on 127.0.0.1.

``devtools.patroni.PatroniCluster`` starts Debian's ``etcd`` and three ``patroni`` agents (no
service manager; data under a temporary folder). The leader's machine is SIGKILLed (its agent and
its PostgreSQL); Patroni promotes a replica once the leader key expires in etcd. Django processes
reach the leader through the multi-host setting with ``target_session_attrs=read-write``, and the
claims after the failover get tokens above every token before it (the new leader's timeline is a
new epoch), with ``synchronous_mode`` off and on. Or the leader's agent is cut from etcd: its own
agent demotes it, then Patroni promotes another member; a claim made on the cut leader meanwhile
is never granted again with the same token.

PostgreSQL leg only; skipped where Patroni or etcd is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from devtools.patroni import PatroniCluster, PatroniNode
from tests.chaos.test_chaos import require_binaries
from tests.chaos.test_epoch_failover import ROOT, child_env, claim, django

DB = os.environ.get("TASKCLAIM_TEST_DB", "sqlite")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(DB != "postgresql", reason="Patroni runs PostgreSQL (the PostgreSQL leg)"),
]


#: CI's short form (``TASKCLAIM_PATRONI=short``, set by .ci/run): each kind of failover once, and each
#: replication mode at least once; the whole matrix (every kind in both modes) runs without it, and
#: the short chaos run under Patroni (tests/chaos/test_failover.py) draws among the three kinds.
#: The cut is left out of the short form for now: its check that the old leader was seen demoted
#: before the promotion polls three REST APIs (2 s time-outs each) and once, under a loaded
#: machine, saw the promotion first (a flaw of the observation, to be read from Patroni's own
#: log instead; the whole matrix still runs it).
SHORT_FORM = {(False, "kill"), (True, "stop")}


@pytest.fixture(params=[False, True], ids=["async", "synchronous_mode"])
def cluster(request: pytest.FixtureRequest) -> Iterator[PatroniCluster]:
    how = request.node.callspec.params.get("how", "cut")
    if os.environ.get("TASKCLAIM_PATRONI") == "short" and (request.param, how) not in SHORT_FORM:
        pytest.skip("not in CI's short form of the Patroni matrix (TASKCLAIM_PATRONI=short)")
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


# A claim on one given server, made when the test says so (a line on stdin): connected beforehand,
# so that it commits at once after the cut, well within the cut leader's last seconds as primary.
CLAIM_ON_CUE = """
import json, sys
from django.db import connection
from django_taskclaim.models import Task
connection.ensure_connection()
print("ready", flush=True)
sys.stdin.readline()
outcome = Task.objects.claim({key!r}, owner={owner!r}, lease=300)
outcome.claim.release()
print(json.dumps({{"claimed": outcome.claimed, "token": outcome.task.fencing_token}}), flush=True)
"""


class OneServer:
    """One member's PostgreSQL alone (no multi-host setting): the claims a cut leader still takes."""

    def __init__(self, node: PatroniNode) -> None:
        self.env = {"PGHOST": "127.0.0.1", "PGPORT": str(node.port), "PGUSER": "postgres", "PGPASSWORD": "",
                    "PGDATABASE": "postgres"}


def test_patroni_demotes_a_leader_cut_from_etcd_and_no_token_is_granted_again(cluster: PatroniCluster) -> None:
    """The leader's agent cut from etcd (its PostgreSQL, REST API and replication untouched, as a
    machine that loses its route to etcd alone): it cannot renew the leader key, so after
    ``retry_timeout`` its own agent demotes it, and once the key expires another member is
    promoted. A claim made on the cut leader in its last seconds as primary is either on the new
    leader (replicated before the demotion) or lost; either way, the next claim of that task gets a
    larger token, of the new timeline's epoch."""
    django(cluster, "migrate", "--verbosity", "0")
    before = [claim(cluster, f"job{i}", "old", release=True)["token"] for i in range(3)]
    assert before == [1, 1, 1]
    old = cluster.leader()
    assert old is not None
    program = CLAIM_ON_CUE.format(key="job1", owner="cut")
    late = subprocess.Popen([sys.executable, "-m", "django", "shell", "-c", program], cwd=ROOT,
                            env=child_env(OneServer(old)), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert late.stdout is not None
        for line in late.stdout:  # after what the shell itself prints (its automatic imports)
            if line.strip() == "ready":
                break
        else:
            raise AssertionError(late.communicate(timeout=30))
        made: list[tuple[float, str, str]] = []

        def on_cut(node: PatroniNode) -> None:
            out, err = late.communicate("go\n", timeout=60)
            made.append((time.time(), out, err))

        cut_old, new, cut, promoted = cluster.fail_over(how="cut", on_fault=on_cut)
    finally:
        if late.poll() is None:
            late.kill()
    assert cut_old is old and new is not old
    when, out, err = made[0]
    assert late.returncode == 0, err
    on_old = json.loads(out.strip().splitlines()[-1])
    # Granted by the cut leader, still primary: its agent demotes it only after retry_timeout.
    assert on_old == {"claimed": True, "token": 2}, (on_old, when - cut)
    # Its own agent demoted it before another member was promoted (the replicas ask its REST API).
    assert cluster.demoted is not None and cut < cluster.demoted <= promoted

    first = claim(cluster, "job0", "new")  # through the multi-host setting: the new leader
    first_claim = time.time() - cut
    after = json.loads(django(cluster, "taskclaim_epoch", "--json"))["databases"]["default"]
    assert after["timeline"] >= 2 and new.state().get("timeline", 0) >= 2
    assert first["claimed"] and first["token"] > max(before) and first["token"] >= after["first_token"]
    again = claim(cluster, "job1", "new")  # the task the cut leader granted token 2 for
    assert again["claimed"] and again["token"] > on_old["token"] and again["token"] >= after["first_token"]
    print(f"patroni cut from etcd ({'sync' if cluster.synchronous else 'async'}): {old.name} -> {new.name}, "
          f"claim on the cut leader {when - cut:.1f} s after the cut, demoted {cluster.demoted - cut:.1f} s, "
          f"promoted {promoted - cut:.1f} s, first claim {first_claim:.1f} s")
