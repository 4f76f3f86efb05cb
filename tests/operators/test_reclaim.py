"""Reclaiming expired leases: the manager method and ``manage.py taskclaim_reclaim`` (and
``reclaim``, the command's name in the design, the same command)."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
import warnings

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_taskclaim.exceptions import StaleClaim
from django_taskclaim.models import Attempt, Task
from tests.conftest import ROOT, expire


def running(key: str, **kwargs):  # type: ignore[no-untyped-def]
    return Task.objects.claim(key, owner="w-" + key, **kwargs).claim


@pytest.mark.django_db
def test_reclaim_moves_expired_back_to_pending_and_fences_the_owner() -> None:
    stale, live = running("stale"), running("live")
    expire(stale)
    assert Task.objects.reclaim_expired() == 1
    task = Task.objects.get(key="stale")
    assert (task.status, task.owner, task.lease_expires_at, task.fencing_token) == ("pending", "", None, 1)
    assert Attempt.objects.get(task=task).outcome == "expired"
    assert Task.objects.get(key="live").status == "running"
    with pytest.raises(StaleClaim):
        stale.complete()
    again = Task.objects.claim("stale").claim
    assert again.token == 2
    live.complete()


@pytest.mark.django_db
def test_reclaim_fails_tasks_without_attempts_left_and_respects_limit() -> None:
    claims = [running(f"k{i}", max_attempts=1 if i == 0 else 5) for i in range(4)]
    for c in claims:
        expire(c)
    assert Task.objects.reclaim_expired(limit=2) == 2
    assert Task.objects.get(key="k0").status == "failed"
    assert Task.objects.reclaim_expired() == 2
    assert Task.objects.reclaim_expired() == 0
    assert Task.objects.pending().count() == 3


@pytest.mark.django_db
def test_command_dry_run_lists_and_changes_nothing() -> None:
    claim = running("job")
    expire(claim)
    out = io.StringIO()
    call_command("taskclaim_reclaim", "--dry-run", stdout=out)
    text = out.getvalue()
    assert "would reclaim 'job'" in text and "token=1" in text and "-> pending" in text
    assert "1 expired task(s) found, nothing changed" in text
    assert Task.objects.get(key="job").status == "running"


@pytest.mark.django_db
def test_command_reclaims_in_batches_up_to_limit() -> None:
    for i in range(7):
        expire(running(f"k{i}"))
    out = io.StringIO()
    call_command("taskclaim_reclaim", "--batch-size", "2", "--limit", "5", "-v", "2", stdout=out)
    text = out.getvalue()
    assert text.count("reclaimed '") == 5
    assert "reclaim: 5 expired task(s): 5 back to pending, 0 failed" in text
    assert Task.objects.expired().count() == 2
    out = io.StringIO()
    call_command("taskclaim_reclaim", stdout=out)
    assert "reclaim: 2 expired task(s)" in out.getvalue()


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--limit", "0"], "must be 1 or more"), (["--batch-size", "x"], "is not a whole number"),
     (["--every", "-1"], "must be greater than zero"), (["--every", "soon"], "not a number of seconds")],
)
def test_command_rejects_bad_arguments(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("taskclaim_reclaim", *args)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_every_loops_until_signalled_and_exits_cleanly(worker_env, signum) -> None:  # type: ignore[no-untyped-def]
    expire(running("first"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "taskclaim_reclaim", "--every", "0.1"], cwd=ROOT, env=worker_env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        assert "reclaim: 1 expired task(s)" in proc.stdout.readline()
        # A task that expires while the loop runs is picked up by a later round.
        expire(running("second"))
        deadline = time.monotonic() + 20
        while Task.objects.get(key="second").status != "pending":
            assert time.monotonic() < deadline, "the loop did not reclaim the second task"
            time.sleep(0.05)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.rstrip().endswith("reclaim: stopped")


@pytest.mark.django_db(transaction=True)
def test_reclaim_is_the_same_command_with_the_same_options_output_and_exit_codes(worker_env) -> None:  # type: ignore[no-untyped-def]
    expire(running("old-name"))
    new = subprocess.run([sys.executable, "-m", "django", "taskclaim_reclaim", "--dry-run", "--json"],
                         cwd=ROOT, env=worker_env, capture_output=True, text=True, timeout=120)
    old = subprocess.run([sys.executable, "-m", "django", "reclaim", "--dry-run", "--json"],
                         cwd=ROOT, env=worker_env, capture_output=True, text=True, timeout=120)
    assert new.returncode == old.returncode == 0, old.stderr
    assert json.loads(old.stdout) == json.loads(new.stdout)  # stdout stays one JSON document
    assert old.stderr == new.stderr and "deprecated" not in old.stderr  # the design's name: no notice
    # Usage errors: exit 2 under both names.
    for name in ("reclaim", "taskclaim_reclaim"):
        bad = subprocess.run([sys.executable, "-m", "django", name, "--requeue-after", "5"],
                             cwd=ROOT, env=worker_env, capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and "--requeue-after needs --requeue" in bad.stderr, bad.stderr
    # In process: the same work done, and no warning.
    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        call_command("reclaim", stdout=out, stderr=err)
    assert "reclaim: 1 expired task(s): 1 back to pending" in out.getvalue()
    assert "deprecated" not in err.getvalue()
