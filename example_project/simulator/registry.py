"""The demo's second service and its relays: the registry server and ``taskclaim_relay`` processes.

:class:`Registry` starts the registry (:mod:`.registry_server`, its own settings and SQLite
file) on a free port of 127.0.0.1 before the agents, so that their outbox messages name its URL;
then ``--relays`` ``manage.py taskclaim_relay`` processes beside the agents. After the agents'
run, :meth:`Registry.drain` waits until no message of the run is pending, stops the relays
(SIGTERM: after the message in hand) and reads back what the registry received.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from devtools.processes import Child, Supervisor

from .report import Log

ROOT = Path(__file__).resolve().parents[2]


class Registry:
    """The registry server and the relays, for one run; :meth:`close` ends whatever still runs."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.processes = Supervisor(cwd=ROOT)
        self.relays: list[Child] = []
        # Started at once; it migrates its SQLite file while the caller migrates its own.
        self.server = self.processes.start(
            "example_project.simulator.registry_server", env={"PYTHONPATH": str(ROOT)}
        )
        self.url = ""

    def wait_ready(self) -> str:
        """The registry's URL, once it serves (before any agent starts: their messages name it)."""
        port = self.server.event("ready", timeout=60)["port"]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    def start_relays(self, n: int) -> None:
        """``n`` relays, with a lease and timeout short enough for a demo (a relay that dies
        mid-delivery leaves its message to another after 5 s)."""
        self.log("registry", "serving", f"{self.url}/artifacts/ (its own SQLite file)")
        for _ in range(n):
            self.relays.append(
                self.processes.start(
                    "example_project.manage", "taskclaim_relay",
                    "--lease", "5", "--timeout", "3", "--backoff", "0.2", "--json",
                    # the caller's settings (and its DATABASE_URL): the relays read its outbox
                    env={"PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "example_project.settings"},
                )
            )
        self.log("relays", "started", f"{n} x manage.py taskclaim_relay")

    def drain(self, run: str, timeout: float) -> list[str]:
        """Wait until no outbox message of ``run`` is pending, then stop the relays; the errors."""
        from django_taskclaim.models import OutboxMessage

        pending = OutboxMessage.objects.filter(
            task_key__startswith=f"{run}:", status=OutboxMessage.Status.PENDING
        )
        errors: list[str] = []
        deadline = time.monotonic() + timeout
        while pending.exists():
            if time.monotonic() > deadline:
                errors.append(f"outbox messages still pending after {timeout:g} s")
                break
            dead = [r for r in self.relays if not r.alive()]
            if len(dead) == len(self.relays):
                errors.append("every relay exited: " + self.processes.failures(ok=()))
                break
            time.sleep(0.1)  # polling the database: the relays' progress is the rows' status
        for relay in self.relays:
            relay.signal(signal.SIGTERM)
        for relay in self.relays:
            try:
                if relay.wait(30) != 0:
                    errors.append(f"relay {relay.pid} exited with {relay.returncode}: {relay.stderr()[-2000:]}")
            except TimeoutError as exc:
                errors.append(str(exc))
        return errors

    def artifacts(self, run: str) -> list[dict[str, Any]]:
        """What the registry received for ``run``, asked over its own HTTP API."""
        url = f"{self.url}/artifacts/?{urllib.parse.urlencode({'run': run})}"
        with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 (our own http URL)
            rows: list[dict[str, Any]] = json.loads(response.read())["artifacts"]
        return rows

    def close(self) -> None:
        self.processes.close()
