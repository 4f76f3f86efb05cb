"""The README's test command, ``python3 -m tests``: the three databases side by side, each run's
time printed, a failing database failing the command, SIGTERM stopping every run and its servers.

It runs the real command on a one-test probe (tests/programs/runner_probe.py), with its logs in a
folder of the test's own (``TASKCLAIM_TEST_LOGS``), never the outer run's ``artifacts/tests/``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

from devtools.polling import wait_until
from tests.conftest import ROOT

PROBE = "tests/programs/runner_probe.py"
DATABASES = ("sqlite", "postgresql", "mariadb")


def runner_env(logs: Path, **extra: str) -> dict[str, str]:
    """The reader's environment, without what an outer run of this command set for its own run."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TASKCLAIM_TEST_", "PG", "MYSQL_", "TASKCLAIM_PROBE_"))}
    return {**env, "TASKCLAIM_TEST_LOGS": str(logs), **extra}


def no_servers(logs: Path, **extra: str) -> dict[str, str]:
    """The environment of a run that starts no server: PostgreSQL and MariaDB "of the reader's" on
    a port nothing listens on (the probe never connects)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    return runner_env(logs, PGHOST="127.0.0.1", PGPORT=port, MYSQL_TCP_PORT=port, **extra)


def test_a_failing_database_fails_the_command_and_each_time_is_printed(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "tests", PROBE, "-q", "-p", "no:cacheprovider"], cwd=ROOT,
                          env=no_servers(tmp_path, TASKCLAIM_PROBE_FAIL_ON="postgresql"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"sqlite: ok in \d+ s  postgresql: FAILED \(exit 1\) in \d+ s  mariadb: ok in \d+ s"
                        r"  \(side by side: \d+ s\)", summary), summary
    # Each log whole, in order, under its heading; the failure's own message among them.
    headings = [done.stdout.index(f"======== {db}: ") for db in DATABASES]
    assert headings == sorted(headings)
    assert "the probe fails on postgresql, as asked" in done.stdout
    for db in DATABASES:
        assert f"===== tests on {db} =====" in (tmp_path / f"{db}.log").read_text()


def test_sigterm_stops_every_database_run_and_its_servers(tmp_path: Path) -> None:
    hold = tmp_path / "held"
    hold.mkdir()
    runner = subprocess.Popen([sys.executable, "-m", "tests", PROBE, "-q", "-p", "no:cacheprovider"], cwd=ROOT,
                              env=runner_env(tmp_path, TASKCLAIM_PROBE_HOLD=str(hold)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: all((hold / f"{db}.pid").exists() for db in DATABASES), timeout=240,
                   what="the probe to run on the three databases at once")
        pids = [int((hold / f"{db}.pid").read_text()) for db in DATABASES]
        logs = "".join((tmp_path / f"{db}.log").read_text() for db in DATABASES)
        ports = [int(p) for p in re.findall(r"started (?:PostgreSQL|MariaDB) on 127\.0\.0\.1:(\d+)", logs)]
        assert len(ports) == 2, logs  # the runs on PostgreSQL and MariaDB started their own servers
        runner.send_signal(signal.SIGTERM)
        out, _ = runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert runner.returncode == 128 + signal.SIGTERM, out
    for pid in pids:  # each pytest stopped ...
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    for port in ports:  # ... and each server with it: nothing listens on their ports any more
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"a server still listens on 127.0.0.1:{port}"
