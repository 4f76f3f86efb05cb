"""A token lost with the old primary is never handed out again by the promoted standby (DESIGN §13).

Real servers (``devtools.replication.PostgresPair``, asynchronous): the standby's replication link
is paused, a claim commits on the primary alone, the primary is SIGKILLed and the standby promoted.
The promoted server has never heard of that claim; its timeline (and so its epoch) is larger, so its
next claim's token is above the lost one, not equal to it. Deterministic: the pause, not a race,
keeps the claim from the standby. The claims run in processes of their own, connected through the
multi-host setting with ``target_session_attrs=read-write`` (tests/chaos/settings.py), as workers are.

Then the synchronous case (issue 42, item 2): a commit whose wait for its standby is cancelled is
reported done by PostgreSQL, with a warning; a claim or a ``fenced()`` block whose commit got that
warning raises ``CommitUnconfirmed``. The helpers here (``django``, ``claim``) serve
tests/chaos/test_patroni.py too.

PostgreSQL leg only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest

from devtools.polling import wait_until
from devtools.replication import PostgresPair
from tests.chaos.test_chaos import require_binaries

DB = os.environ.get("TASKCLAIM_TEST_DB", "sqlite")
ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(DB != "postgresql", reason="failover needs PostgreSQL servers (the PostgreSQL leg)"),
]

CLAIM = """
import json
from django_taskclaim.models import Task
outcome = Task.objects.claim({key!r}, owner={owner!r}, lease=300)
claim = outcome.claim
if claim is not None and {release!r}:
    claim.release()
print(json.dumps({{"claimed": outcome.claimed, "token": outcome.task.fencing_token}}))
"""


@pytest.fixture
def pair() -> Iterator[PostgresPair]:
    require_binaries()
    # A link of its own (a few ms of lag) between the standby and the primary, to pause.
    with PostgresPair(synchronous=False, lag=0.005) as servers:
        yield servers


class Servers(Protocol):
    """What the helpers need of the servers: the libpq environment of their writable node."""

    @property
    def env(self) -> dict[str, str]: ...


def child_env(pair: Servers) -> dict[str, str]:
    """A Django process's environment on the pair: both nodes listed, the writable one chosen."""
    return {**os.environ, **{k: v for k, v in pair.env.items() if k != "PGTARGETSESSIONATTRS"},
            "DJANGO_SETTINGS_MODULE": "tests.chaos.settings", "TASKCLAIM_TEST_DB": "postgresql",
            "TASKCLAIM_TEST_DB_NAME": "postgres", "CHAOS_TARGET_SESSION_ATTRS": "read-write",
            "PYTHONPATH": str(ROOT), "TASKCLAIM_FORKSERVER": "0"}


def django(pair: Servers, *args: str) -> str:
    """``python -m django ARGS`` in a process of its own, on whichever node is the primary."""
    done = subprocess.run([sys.executable, "-m", "django", *args], cwd=ROOT, env=child_env(pair), capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def claim(pair: Servers, key: str, owner: str, release: bool = False) -> dict:  # type: ignore[type-arg]
    return json.loads(django(pair, "shell", "-c", CLAIM.format(key=key, owner=owner, release=release)))  # type: ignore[no-any-return]


def caught_up(pair: PostgresPair) -> None:
    """Wait until the standby has replayed everything the primary has written."""
    target = pair.primary.sql("SELECT pg_current_wal_lsn()")
    wait_until(lambda: pair.standby.sql("SELECT pg_last_wal_replay_lsn() >= :'lsn'::pg_lsn", lsn=target) == "t",
               timeout=60, what="the standby replaying the primary's WAL", interval=0.05)


def test_a_claim_lost_with_the_primary_never_gets_its_token_again(pair: PostgresPair) -> None:
    django(pair, "migrate", "--verbosity", "0")
    assert claim(pair, "job", "first", release=True) == {"claimed": True, "token": 1}  # pending again, token 1
    caught_up(pair)

    assert pair.link is not None
    pair.link.pause()  # from now on the standby hears nothing
    lost_job = claim(pair, "job", "lost")  # committed on the primary alone (asynchronous)
    lost_new = claim(pair, "fresh", "lost")  # a key the standby never saw
    assert (lost_job, lost_new) == ({"claimed": True, "token": 2}, {"claimed": True, "token": 1})
    old, new = pair.primary, pair.standby
    old.kill()
    new.promote()
    pair.primary, pair.standby = new, old
    assert new.sql("SELECT fencing_token FROM django_taskclaim_task WHERE key = 'job'") == "1"  # the claim was lost
    assert new.sql("SELECT count(*) FROM django_taskclaim_task WHERE key = 'fresh'") == "0"

    again_job = claim(pair, "job", "new")
    again_new = claim(pair, "fresh", "new")
    assert again_job["claimed"] and again_new["claimed"]
    # Above the tokens the old primary handed out and lost: a fence can tell the two owners apart.
    assert again_job["token"] > lost_job["token"]
    assert again_new["token"] > lost_new["token"]
    epoch = json.loads(django(pair, "taskclaim_epoch", "--json"))["databases"]["default"]
    assert epoch["timeline"] == 2
    assert again_job["token"] == again_new["token"] == epoch["first_token"]


# -- a commit whose wait for the synchronous standby was cancelled (issue 42, item 2) ---------------

UNCONFIRMED = """
import json, sys
from django_taskclaim.exceptions import CommitUnconfirmed
from django_taskclaim.models import Task

def say(**event):
    print(json.dumps(event), flush=True)

claim = Task.objects.claim("held", owner="w", lease=300).claim
say(event="claimed", token=claim.token)
sys.stdin.readline()  # the standby is gone: every commit now waits for it
try:
    with claim.fenced():
        claim.complete("done")
    say(event="fenced", confirmed=True)
except CommitUnconfirmed as exc:
    say(event="fenced", error=type(exc).__name__, message=str(exc))
try:
    outcome = Task.objects.claim("new", owner="w", lease=300)
    say(event="claim", claimed=outcome.claimed, token=outcome.task.fencing_token)
except CommitUnconfirmed as exc:
    say(event="claim", error=type(exc).__name__, message=str(exc))
"""


@pytest.fixture
def sync_pair() -> Iterator[PostgresPair]:
    require_binaries()
    with PostgresPair(synchronous=True) as servers:
        yield servers


def cancel_the_wait(pair: PostgresPair) -> None:
    """Wait for a session stuck in its commit's wait for the standby (SyncRep), then cancel it."""
    wait_until(lambda: pair.primary.sql(
        "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity WHERE wait_event = 'SyncRep'") != "0",
        timeout=60, what="a commit waiting for the synchronous standby", interval=0.05)


def test_a_commit_whose_wait_for_the_standby_was_cancelled_is_not_trusted(sync_pair: PostgresPair) -> None:
    """PostgreSQL reports a commit whose wait was cancelled as done, with a warning, although the
    standby may lack it: fenced() raises CommitUnconfirmed after such a commit, and a claim raises it
    instead of returning a claim whose token a failover could hand out again."""
    pair = sync_pair
    django(pair, "migrate", "--verbosity", "0")
    env = child_env(pair)
    child = subprocess.Popen([sys.executable, "-m", "django", "shell", "--verbosity", "0", "-c", UNCONFIRMED],
                             cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        claimed = json.loads(child.stdout.readline() or "null")
        assert claimed and claimed["event"] == "claimed", child.stderr.read() if child.stderr else ""
        pair.standby.kill()
        child.stdin.write("go\n")
        child.stdin.flush()
        cancel_the_wait(pair)  # the fenced() block's commit
        fenced = json.loads(child.stdout.readline())
        cancel_the_wait(pair)  # the new claim's commit
        claim = json.loads(child.stdout.readline())
        assert child.wait(60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert fenced["event"] == "fenced" and fenced.get("error") == "CommitUnconfirmed", fenced
    assert claim["event"] == "claim" and claim.get("error") == "CommitUnconfirmed", claim
    # Done on the primary all the same (the warning's words): nothing was rolled back.
    assert pair.primary.sql("SELECT status FROM django_taskclaim_task WHERE key = 'held'") == "succeeded"
    assert pair.primary.sql("SELECT status FROM django_taskclaim_task WHERE key = 'new'") == "running"
