"""``python3 -m example_project --celery``: the same demo through real Celery workers and Redis.

The agents are ``celery worker`` processes (solo pool, prefetch 1, ``acks_late``) running
:mod:`example_project.testgen.tasks`. Jobs are requested through ``POST /api/jobs``, which
publishes with ``enqueue_once`` on commit; the driver then publishes every job again (a
producer that retried), the Redis visibility timeout is short so that slow messages are
redelivered, and it pauses the worker running one job past its lease and kills the worker
running another. Progress is read from the database (the workers print nothing to the demo).

Imported only with ``--celery``: the demo without it never imports Celery.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from devtools.processes import Child, Supervisor

from .client import Job
from .report import Log, short

ROOT = Path(__file__).resolve().parents[2]  # the workers import example_project from here


def celery_environment(args: argparse.Namespace) -> dict[str, str]:
    """The settings of ``--celery`` (read by ``example_project.settings``), before Django starts."""
    return {
        "TESTGEN_DISPATCH": "celery",
        "REDIS_URL": args.redis_url,
        "TESTGEN_VISIBILITY_TIMEOUT": str(args.visibility),
    }


class CeleryDriver:
    """Starts the workers, publishes the duplicates, plays the chaos; :meth:`run` returns counts."""

    deliveries_note = "messages the demo published; broker redeliveries and busy retries come on top"

    def __init__(self, args: argparse.Namespace, run: str, log: Log) -> None:
        from django.conf import settings

        from ..celery_app import app

        self.args, self.run_id, self.log = args, run, log
        # A queue of its own, for the workers (environment) and for publishing (this process).
        queue = os.environ["TESTGEN_QUEUE"] = f"testgen-{run}-{uuid.uuid4().hex[:6]}"
        settings.CELERY_TASK_DEFAULT_QUEUE = app.conf.task_default_queue = queue
        self.processes = Supervisor(cwd=ROOT)  # the workers: started, paused and killed
        self.workers: dict[str, Child] = {}
        self.pause: dict[str, Any] | None = None
        self.paused_done = self.killed_done = False
        self.last_attempt = 0
        self.errors: list[str] = []
        self.logs: list[Path] = []

    def start_worker(self) -> str:
        from django.conf import settings

        name = f"agent-{len(self.workers) + 1}"
        # Each worker's own output (banner, warnings, tracebacks) goes to var/celery-RUN-NAME.log.
        path = Path(settings.VAR_DIR) / f"celery-{self.run_id}-{name}.log"
        self.logs.append(path)
        argv = [
            "celery",
            "-A",
            "example_project.celery_app",
            "worker",
            "--pool",
            "solo",
            "--prefetch-multiplier",
            "1",
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"{name}.{uuid.uuid4().hex[:6]}@%h",
            "--loglevel",
            "ERROR",
        ]
        self.workers[name] = self.processes.start(
            *argv, env=dict(os.environ, PYTHONPATH=str(ROOT), TESTGEN_AGENT=name), stderr=path
        )
        self.log("celery", "started", f"{name} (pid {self.workers[name].pid})")
        return name

    def agent_of(self, owner: str) -> str:
        """Claims made by the bridge are owned by ``host:pid:random``: map the pid to a worker."""
        parts = owner.split(":")
        pid = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else -1
        return next((n for n, p in self.workers.items() if p.pid == pid), owner)

    def follow(self) -> None:
        """Print the attempts recorded since the last call: claims, takeovers, duplicates."""
        from django_taskclaim.models import Attempt

        new = (
            Attempt.objects.filter(task__key__startswith=f"{self.run_id}:", id__gt=self.last_attempt)
            .select_related("task")
            .order_by("id")
        )
        for attempt in new:
            self.last_attempt = attempt.id
            job = short(attempt.task.tenant, attempt.task.key)
            who = self.agent_of(attempt.owner)
            if attempt.token is None:
                self.log(
                    who, "duplicate", f"{job}  refused (found it {attempt.task.status} or running)"
                )
            elif attempt.token > 1:
                self.log(who, "TAKEOVER", f"{job}  token {attempt.token}", always=True)
            else:
                self.log(who, "claimed", f"{job}  token {attempt.token}")

    def chaos(self) -> None:
        from django_taskclaim.models import Task

        running = list(Task.objects.filter(key__startswith=f"{self.run_id}:", status="running"))
        if not self.paused_done:
            for task in running:
                if self.agent_of(task.owner) == "agent-1":
                    self.workers["agent-1"].stop()
                    self.paused_done = True
                    self.pause = {
                        "task": task.pk,
                        "token": task.fencing_token,
                        "since": time.monotonic(),
                    }
                    self.log(
                        "chaos",
                        "SIGSTOP",
                        f"agent-1 paused mid-work on {short(task.tenant, task.key)} "
                        f"(token {task.fencing_token}) until the job is taken over",
                        always=True,
                    )
                    break
        if self.pause is not None:
            p = self.pause
            taken = Task.objects.filter(pk=p["task"], fencing_token__gt=p["token"]).exists()
            waited = time.monotonic() - p["since"]
            if taken or waited > 4 * self.args.lease + 2 * self.args.visibility:
                self.workers["agent-1"].cont()
                self.pause = None
                self.log("chaos", "SIGCONT", f"agent-1 resumed after {waited:.1f}s", always=True)
        if not self.killed_done:
            for task in running:
                if self.agent_of(task.owner) == "agent-2":
                    self.workers["agent-2"].kill()
                    self.workers["agent-2"].wait(15)
                    self.killed_done = True
                    self.log(
                        "chaos",
                        "SIGKILL",
                        f"agent-2 killed mid-work on {short(task.tenant, task.key)}",
                        always=True,
                    )
                    self.log(
                        "chaos", "restart", f"{self.start_worker()} replaces agent-2", always=True
                    )
                    break

    def banner(self) -> str:
        a = self.args
        return (
            f"django-taskclaim demo through Celery: {a.jobs} jobs, {a.agents} workers, each job "
            f"published {a.copies}x, lease {a.lease:g}s, work {a.work_seconds:g}s, visibility "
            f"timeout {a.visibility:g}s, broker {a.redis_url}"
        )

    def run(self, jobs: list[Job]) -> dict[str, int]:
        from django_taskclaim.models import Task

        from ..testgen.tasks import generate_suite

        for _ in range(self.args.agents):
            self.start_worker()
        published = len(jobs)  # one message each, sent by enqueue_once when the request committed
        for tenant, run, _key, payload in jobs:
            for _ in range(self.args.copies - 1):  # the producer retried: the same job again
                generate_suite.apply_async(args=(tenant, run, payload))
                published += 1
        self.log("client", "published", f"{published} messages for {len(jobs)} jobs", always=True)
        deadline = time.monotonic() + self.args.timeout
        done_since: float | None = None
        try:
            while True:
                if time.monotonic() > deadline:
                    self.errors.append(f"gave up after --timeout {self.args.timeout:.0f}s")
                    break
                for name, proc in self.workers.items():
                    if not proc.alive() and not (name == "agent-2" and self.killed_done):
                        self.errors.append(
                            f"{name} exited unexpectedly (exit code {proc.returncode})"
                        )
                if self.errors:
                    break
                self.follow()
                self.chaos()
                unfinished = (
                    Task.objects.filter(key__startswith=f"{self.run_id}:").unfinished().exists()
                )
                if unfinished or self.pause is not None:
                    done_since = None
                elif done_since is None:
                    done_since = time.monotonic()
                elif time.monotonic() - done_since > self.args.lease + 1:
                    break  # every job finished; late duplicates had time to be refused
                time.sleep(0.1)  # polling the database is how this driver observes the workers
        finally:
            self.stop_workers()
        self.follow()
        if self.errors:
            print("worker logs: " + " ".join(str(p) for p in self.logs), file=sys.stderr)
        return {"deliveries": published, "redeliveries": 0, "retries": 0, "drafts_discarded": 0}

    def stop_workers(self) -> None:
        for proc in self.workers.values():
            proc.cont()
            proc.signal(signal.SIGTERM)  # warm shutdown
        for name, proc in self.workers.items():
            try:
                proc.wait(15)
            except TimeoutError:
                proc.kill()
                proc.wait(15)
                self.errors.append(f"{name} did not stop within 15s; killed")
        self.processes.close()
