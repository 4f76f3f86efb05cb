"""``python -m benchmarks.sharded`` in smoke size, on two throwaway PostgreSQL servers.

No timed assertion: the run proves the benchmark still works end to end (its table, every
queued task run once on each set-up), not how fast anything is (docs/scaling.md has the figures).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(os.environ.get("TASKCLAIM_TEST_DB", "sqlite") != "postgresql",
                                reason="the benchmark needs PostgreSQL servers (the PostgreSQL leg)")


def test_the_sharded_benchmark_runs_on_two_servers(tmp_path: Path) -> None:
    out = tmp_path / "sharded.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "DJANGO_SETTINGS"))}
    done = subprocess.run([sys.executable, "-m", "benchmarks.sharded", "--start-servers", "--smoke", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = out.read_text()
    for phase in ("by-key", "drain, one-task loop", "drain, work()"):
        assert f"| {phase} " in table, table
    assert "tasks per server {'default': 100, 'shard2': 100}" in table  # 8 tenants on each server
