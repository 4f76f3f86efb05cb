"""The demo: several agents, a queue that delivers every job more than once, one agent paused
past its lease and another killed mid-work — and every job takes effect exactly once.

    python3 -m example_project                      # SQLite under example_project/var/, no server
    DATABASE_URL=postgresql://u:p@host/db python3 -m example_project
    python3 -m example_project --celery --redis-url redis://127.0.0.1:6379/0

The driver plays the message queue: it requests the jobs through the project's own
``POST /api/jobs`` view, delivers each job ``--copies`` times to agent processes (prefetch 1),
redelivers a message whose agent died or did not acknowledge it within the visibility
timeout, and re-sends a job an agent found busy (like a Celery retry). It prints what happens,
then checks the database: every job SUCCEEDED, exactly one published suite per job, each
referenced artifact on disk. It exits 1 if any job took effect twice or was lost.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be 1 or more")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < 3600:
        raise argparse.ArgumentTypeError(f"{value} must be between 0 and 3600 seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m example_project",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--jobs", type=positive_int, default=12, help="jobs to request (default: %(default)r)"
    )
    p.add_argument(
        "--agents",
        type=positive_int,
        default=4,
        help="agent processes, at least 2: one is paused, one killed (default: %(default)r)",
    )
    p.add_argument(
        "--copies",
        type=positive_int,
        default=2,
        help="deliveries of each job by the queue (default: %(default)r)",
    )
    p.add_argument(
        "--work-seconds",
        type=positive_seconds,
        default=1.2,
        help="simulated generation time per job (default: %(default)r)",
    )
    p.add_argument(
        "--steps",
        type=positive_int,
        default=4,
        help="tests per generated suite (default: %(default)r)",
    )
    p.add_argument(
        "--lease",
        type=positive_seconds,
        default=1.5,
        help="the agents' lease in seconds; heartbeats every lease/3 (default: %(default)r)",
    )
    p.add_argument(
        "--visibility",
        type=positive_seconds,
        default=None,
        help="seconds before an unacknowledged delivery is redelivered "
        "(default: 2 x lease + work seconds)",
    )
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=180.0,
        help="give up after this many seconds (default: %(default)r)",
    )
    p.add_argument(
        "--seed", type=int, default=42, help="delivery order seed (default: %(default)r)"
    )
    p.add_argument(
        "--run", default=None, help="run id in the job keys (default: the next free run-N)"
    )
    p.add_argument("--quiet", action="store_true", help="print only the chaos and the summary")
    p.add_argument("--json", action="store_true", help="end with the summary as one JSON line")
    p.add_argument(
        "--celery",
        action="store_true",
        help="run the agents as real Celery workers (needs Redis: --redis-url or REDIS_URL)",
    )
    p.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL", ""),
        help="Redis broker for --celery (default: $REDIS_URL)",
    )
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.agents < 2:
        parser.error("--agents must be at least 2: one agent is paused and another is killed")
    if args.celery and not args.redis_url:
        parser.error("--celery needs a Redis URL: --redis-url redis://HOST:PORT/N or REDIS_URL")
    if args.visibility is None:
        args.visibility = 2 * args.lease + args.work_seconds
    return args


def setup_django() -> None:
    # This command is the example project's own: its settings, whatever the shell says.
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    Path(settings.ARTIFACT_DIR).mkdir(parents=True, exist_ok=True)  # var/ holds the SQLite file too
    call_command("migrate", verbosity=0)


# -- output ------------------------------------------------------------------------------
class Log:
    def __init__(self, quiet: bool, out: TextIO = sys.stdout) -> None:
        self.quiet, self.out, self.t0 = quiet, out, time.monotonic()
        self.lock = threading.Lock()

    def __call__(self, who: str, what: str, detail: str = "", *, always: bool = False) -> None:
        if self.quiet and not always:
            return
        with self.lock:
            print(
                f"{time.monotonic() - self.t0:6.2f}s  {who:<9} {what:<10} {detail}".rstrip(),
                file=self.out,
                flush=True,
            )


def short(tenant: str, key: str) -> str:
    return f"{tenant}/{key}"


# -- the queue's side --------------------------------------------------------------------
@dataclass
class Delivery:
    id: str
    tenant: str
    run: str
    key: str
    payload: dict[str, Any]
    why: str = "publish"  # publish | redelivery | retry

    def message(self) -> str:
        return json.dumps(
            {
                "delivery": self.id,
                "tenant": self.tenant,
                "run": self.run,
                "key": self.key,
                "payload": self.payload,
            }
        )


@dataclass
class Agent:
    name: str
    proc: subprocess.Popen[str]
    current: Delivery | None = None
    sent_at: float = 0.0
    ready: bool = False
    paused: bool = False
    killed: bool = False
    closing: bool = False
    reader: threading.Thread | None = field(default=None, repr=False)

    def send(self, delivery: Delivery) -> None:
        stdin = self.proc.stdin
        if stdin is None:
            raise RuntimeError(f"{self.name} has no stdin pipe")
        self.current, self.sent_at = delivery, time.monotonic()
        stdin.write(delivery.message() + "\n")
        stdin.flush()


class Demo:
    def __init__(self, args: argparse.Namespace, log: Log) -> None:
        self.args, self.log = args, log
        self.events: queue.Queue[tuple[Agent, dict[str, Any]]] = queue.Queue()
        self.agents: list[Agent] = []
        self.ready: deque[Delivery] = deque()
        self.scheduled: list[tuple[float, int, Delivery]] = []
        self.redelivered: set[str] = (
            set()
        )  # deliveries already redelivered by the visibility timeout
        self.seq = 0
        self.counts = {"deliveries": 0, "redeliveries": 0, "retries": 0, "drafts_discarded": 0}
        self.pause_target = "agent-1"
        self.kill_target = "agent-2"
        self.pause: dict[str, Any] | None = None  # the paused agent and the claim it holds
        self.paused_done = False
        self.killed_done = False
        self.errors: list[str] = []
        self.published = self.jobs = 0

    # agents ------------------------------------------------------------------------------
    def start_agent(self) -> Agent:
        name = f"agent-{len(self.agents) + 1}"
        a = self.args
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "example_project.agent",
                "--name",
                name,
                "--lease",
                str(a.lease),
                "--work-seconds",
                str(a.work_seconds),
                "--steps",
                str(a.steps),
                # Every second agent runs its jobs through a real LangGraph graph (graph_agent.py).
                *(["--langgraph"] if len(self.agents) % 2 else []),
            ],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        agent = Agent(name, proc)
        agent.reader = threading.Thread(target=self._read, args=(agent,), daemon=True)
        agent.reader.start()
        self.agents.append(agent)
        return agent

    def _read(self, agent: Agent) -> None:
        for line in agent.proc.stdout or ():
            try:
                self.events.put((agent, json.loads(line)))
            except json.JSONDecodeError:
                self.events.put((agent, {"event": "output", "text": line.rstrip()}))
        self.events.put((agent, {"event": "exit"}))

    # the queue ---------------------------------------------------------------------------
    def new_delivery(
        self, tenant: str, run: str, key: str, payload: dict[str, Any], why: str
    ) -> Delivery:
        self.seq += 1
        return Delivery(f"d{self.seq}", tenant, run, key, payload, why)

    def copy_of(self, d: Delivery, why: str) -> Delivery:
        return self.new_delivery(d.tenant, d.run, d.key, d.payload, why)

    def publish_all(self, jobs: list[tuple[str, str, str, dict[str, Any]]]) -> None:
        """Each job ``--copies`` times; copies land near each other, so agents race for them."""
        rng = random.Random(self.args.seed)
        order = []
        for i, (tenant, run, key, payload) in enumerate(jobs):
            for c in range(self.args.copies):
                order.append(
                    (
                        i + (rng.uniform(0, 2.5) if c else 0),
                        self.new_delivery(tenant, run, key, payload, "publish"),
                    )
                )
        self.ready.extend(d for _, d in sorted(order, key=lambda pair: pair[0]))

    def dispatch(self) -> None:
        now = time.monotonic()
        while self.scheduled and self.scheduled[0][0] <= now:
            self.ready.append(heapq.heappop(self.scheduled)[2])
        # The visibility timeout: a message not acknowledged in time goes to another consumer.
        for agent in self.agents:
            d = agent.current
            if d and d.id not in self.redelivered and now - agent.sent_at > self.args.visibility:
                self.redelivered.add(d.id)
                self.counts["redeliveries"] += 1
                self.ready.appendleft(self.copy_of(d, "redelivery"))
                self.log(
                    "queue",
                    "redeliver",
                    f"{d.id} unacknowledged by {agent.name} for "
                    f"{self.args.visibility:.1f}s (visibility timeout)",
                )
        for agent in self.agents:
            if not self.ready:
                break
            if agent.ready and agent.current is None and not agent.killed and not agent.closing:
                d = self.ready.popleft()
                agent.send(d)
                self.counts["deliveries"] += 1

    def idle(self) -> bool:
        return (
            not self.ready
            and not self.scheduled
            and self.pause is None
            and all(a.current is None for a in self.agents if not a.killed)
        )

    # events ------------------------------------------------------------------------------
    def on_event(self, agent: Agent, ev: dict[str, Any]) -> None:
        kind = ev["event"]
        job = short(ev.get("tenant", ""), ev.get("key", ""))
        if kind == "ready":
            agent.ready = True
            kind = " (LangGraph graph)" if ev.get("kind") == "langgraph" else ""
            self.log(agent.name, "started", f"pid {ev['pid']}{kind}")
        elif kind == "claimed":
            if "previous_owner" in ev:
                self.log(
                    agent.name,
                    "TAKEOVER",
                    f"{job}  token {ev['token']} "
                    f"(lease of {ev['previous_owner']}, token {ev['previous_token']}, expired)",
                    always=True,
                )
            else:
                self.log(agent.name, "claimed", f"{job}  token {ev['token']}  [{ev['delivery']}]")
            if agent.name == self.pause_target and not self.paused_done:
                self.stop(agent, ev)
        elif kind == "progress":
            if ev["step"] == 1:
                self.log(agent.name, "working", f"{job}  generating {ev['of']} tests")
            if agent.name == self.kill_target and not self.killed_done:
                self.kill(agent)
        elif kind == "duplicate":
            delivery = agent.current
            if ev["retry_in"] is not None and delivery is not None:
                self.log(
                    agent.name,
                    "duplicate",
                    f"{job}  running under {ev['owner']} (token "
                    f"{ev['token']}): refused, retry in {ev['retry_in']:.1f}s  [{ev['delivery']}]",
                )
                self.counts["retries"] += 1
                heapq.heappush(
                    self.scheduled,
                    (
                        time.monotonic() + ev["retry_in"],
                        self.seq,
                        self.copy_of(delivery, "retry"),
                    ),
                )
            else:
                self.log(
                    agent.name,
                    "duplicate",
                    f"{job}  already {ev['status']}: refused, "
                    f"stored result {ev['artifact'] or '-'}  [{ev['delivery']}]",
                )
        elif kind == "published":
            self.published += 1
            self.log(
                agent.name,
                "published",
                f"{job}  token {ev['token']} -> {ev['artifact']}  "
                f"({self.published}/{self.jobs} jobs done)",
            )
        elif kind == "fenced":
            self.counts["drafts_discarded"] += 1
            self.log(
                agent.name,
                "FENCED",
                f"{job}  token {ev['token']}: {ev['action']} refused, "
                "draft discarded (another agent owns the job now)",
                always=True,
            )
        elif kind == "ack":
            if agent.current and agent.current.id == ev["delivery"]:
                agent.current = None
        elif kind == "output":
            self.log(agent.name, "output", ev["text"])
        elif kind == "exit" and not (agent.killed or agent.closing):
            self.errors.append(f"{agent.name} exited unexpectedly (exit code {agent.proc.wait()})")

    # chaos -------------------------------------------------------------------------------
    def stop(self, agent: Agent, ev: dict[str, Any]) -> None:
        os.kill(agent.proc.pid, signal.SIGSTOP)
        agent.paused, self.paused_done = True, True
        self.pause = {
            "agent": agent,
            "tenant": ev["tenant"],
            "key": ev["key"],
            "token": ev["token"],
            "since": time.monotonic(),
        }
        self.log(
            "chaos",
            "SIGSTOP",
            f"{agent.name} paused mid-work on {short(ev['tenant'], ev['key'])} "
            f"(token {ev['token']}); it stays paused until its lease ran out and the job was "
            "taken over",
            always=True,
        )

    def maybe_resume(self) -> None:
        from django_taskclaim.models import Task

        p = self.pause
        if p is None:
            return
        taken = Task.objects.filter(
            tenant=p["tenant"], key=p["key"], fencing_token__gt=p["token"]
        ).exists()
        waited = time.monotonic() - p["since"]
        if not taken and waited < 4 * self.args.lease + 2 * self.args.visibility:
            return
        os.kill(p["agent"].proc.pid, signal.SIGCONT)
        p["agent"].paused, self.pause = False, None
        self.log(
            "chaos",
            "SIGCONT",
            f"{p['agent'].name} resumed after {waited:.1f}s"
            + ("; its job has a newer owner" if taken else "; nobody took the job over"),
            always=True,
        )

    def kill(self, agent: Agent) -> None:
        agent.killed, self.killed_done = True, True
        os.kill(agent.proc.pid, signal.SIGKILL)
        agent.proc.wait()
        self.log("chaos", "SIGKILL", f"{agent.name} killed mid-work", always=True)
        if agent.current is not None:
            # The consumer is gone with an unacknowledged message: the queue redelivers it.
            self.counts["redeliveries"] += 1
            self.ready.appendleft(self.copy_of(agent.current, "redelivery"))
            self.log("queue", "redeliver", f"{agent.current.id} of the killed {agent.name}")
            agent.current = None
        replacement = self.start_agent()
        self.log("chaos", "restart", f"{replacement.name} replaces {agent.name}", always=True)

    # main loop ---------------------------------------------------------------------------
    def run(self, jobs: list[tuple[str, str, str, dict[str, Any]]]) -> None:
        for _ in range(self.args.agents):
            self.start_agent()
        self.jobs = len(jobs)
        self.publish_all(jobs)
        deadline = time.monotonic() + self.args.timeout
        last_poll = 0.0
        try:
            while not self.errors:
                if time.monotonic() > deadline:
                    self.errors.append(f"gave up after --timeout {self.args.timeout:.0f}s")
                    break
                self.dispatch()
                try:
                    agent, ev = self.events.get(timeout=0.05)
                    self.on_event(agent, ev)
                    while True:  # drain what else arrived
                        agent, ev = self.events.get_nowait()
                        self.on_event(agent, ev)
                except queue.Empty:
                    pass
                if time.monotonic() - last_poll > 0.1:
                    last_poll = time.monotonic()
                    self.maybe_resume()
                if self.idle():
                    break
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        for agent in self.agents:
            if agent.paused:
                os.kill(agent.proc.pid, signal.SIGCONT)
            if agent.proc.poll() is None and agent.proc.stdin is not None:
                agent.closing = True
                agent.proc.stdin.close()
        for agent in self.agents:
            try:
                agent.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                agent.proc.kill()
                agent.proc.wait()
                self.errors.append(f"{agent.name} did not stop within 15s; killed")
        while True:
            try:
                agent, ev = self.events.get_nowait()
            except queue.Empty:
                break
            if ev["event"] not in ("exit", "ack"):
                self.on_event(agent, ev)


# -- before and after ------------------------------------------------------------------------
def next_run() -> str:
    from django_taskclaim.models import Task

    from .testgen.models import TestSuite

    n = 1
    while (
        Task.objects.filter(key__startswith=f"run-{n}:").exists()
        or TestSuite.objects.filter(run=f"run-{n}").exists()
    ):
        n += 1
    return f"run-{n}"


def request_jobs(run: str, count: int, log: Log) -> list[tuple[str, str, str, dict[str, Any]]]:
    """Request every job through ``POST /api/jobs``; the first one twice (a double click)."""
    from django.test import Client

    from .testgen.jobs import demo_jobs

    client = Client()
    jobs = []
    for i, spec in enumerate(demo_jobs(run, count)):
        body = {
            "tenant": spec.tenant,
            "run": spec.run,
            "service": spec.service,
            "endpoint": spec.endpoint,
            "version": spec.version,
        }
        for click in range(2 if i == 0 else 1):
            response = client.post(
                "/api/jobs", data=json.dumps(body), content_type="application/json"
            )
            data = response.json()
            if response.status_code not in (200, 201):
                raise SystemExit(f"POST /api/jobs failed with {response.status_code}: {data}")
            if click:
                log(
                    "client",
                    "requested",
                    f"{short(data['tenant'], data['key'])} again (a double click): "
                    f"HTTP {response.status_code}, created={data['created']}, the same job",
                )
        jobs.append((data["tenant"], run, data["key"], spec.payload))
    tenant, _, key, _ = jobs[0]
    log(
        "client",
        "requested",
        f"{len(jobs)} jobs through POST /api/jobs, e.g. {short(tenant, key)}",
        always=True,
    )
    return jobs


def summarize(
    run: str, jobs: list[tuple[str, str, str, dict[str, Any]]], counts: dict[str, int]
) -> dict[str, Any]:
    """Check the database and the artifacts: what happened; did every job take effect once?"""
    from django.conf import settings
    from django.db.models import Count, Sum

    from django_taskclaim.models import Attempt, Task

    from .testgen.models import TestSuite

    tasks = {(t.tenant, t.key): t for t in Task.objects.filter(key__startswith=f"{run}:")}
    attempts = Attempt.objects.filter(task__key__startswith=f"{run}:")
    suites: dict[tuple[str, str], list[TestSuite]] = {}
    for s in TestSuite.objects.filter(run=run):
        suites.setdefault((s.tenant, s.job_key), []).append(s)
    lost, twice, published = [], [], 0
    for tenant, _, key, _ in jobs:
        task, rows = tasks.get((tenant, key)), suites.get((tenant, key), [])
        if len(rows) > 1:
            twice.append(short(tenant, key))
        if task is None or task.status != Task.Status.SUCCEEDED or not rows:
            lost.append(short(tenant, key))
            continue
        row = rows[-1]
        if (
            task.result_ref
            and task.result_ref == row.artifact
            and row.token == task.fencing_token
            and (Path(settings.ARTIFACT_DIR) / task.result_ref).is_file()
        ):
            published += 1
    run_dir_files = {
        str(p.relative_to(settings.ARTIFACT_DIR))
        for p in Path(settings.ARTIFACT_DIR).glob(f"*/{run}/*.py")
    }
    referenced = {t.result_ref for t in tasks.values() if t.result_ref}
    by_outcome = dict(
        attempts.values_list("outcome").annotate(n=Count("id")).values_list("outcome", "n")
    )
    return {
        "database": _vendor(),
        "run": run,
        "jobs": len(jobs),
        "deliveries": counts["deliveries"],
        "redeliveries": counts["redeliveries"],
        "busy_retries": counts["retries"],
        "executions_started": attempts.filter(token__isnull=False).count(),
        "duplicates_refused": by_outcome.get("duplicate", 0),
        "takeovers": by_outcome.get("taken_over", 0) + by_outcome.get("expired", 0),
        "stale_writes_refused": attempts.aggregate(n=Sum("stale_writes"))["n"] or 0,
        "artifacts_published": published,
        "drafts_discarded": counts["drafts_discarded"] + len(run_dir_files - referenced),
        "lost": lost,
        "took_effect_twice": twice,
        "ok": not lost and not twice and published == len(jobs),
    }


def _vendor() -> str:
    from django.db import connection

    return str(connection.vendor)


def print_summary(s: dict[str, Any], out: TextIO = sys.stdout) -> None:
    rows = [
        ("jobs", s["jobs"], f"on {s['database']}, run {s['run']}"),
        (
            "deliveries",
            s["deliveries"],
            s.get("deliveries_note")
            or f"incl. {s['redeliveries']} redelivered, {s['busy_retries']} busy retries",
        ),
        (
            "executions started",
            s["executions_started"],
            "claims: work may start again after a lease expires",
        ),
        (
            "duplicates refused",
            s["duplicates_refused"],
            "deliveries that found the job running or done",
        ),
        ("takeovers", s["takeovers"], "expired leases claimed by another agent"),
        (
            "stale writes refused",
            s["stale_writes_refused"],
            "writes by agents that had been fenced off",
        ),
        (
            "artifacts published",
            s["artifacts_published"],
            "= jobs, exactly" if s["artifacts_published"] == s["jobs"] else f"!= {s['jobs']} jobs",
        ),
        (
            "drafts discarded",
            s["drafts_discarded"],
            "work of paused/killed agents, never published",
        ),
    ]
    print("\nSummary", file=out)
    for label, n, note in rows:
        print(f"  {label:<22}{n:>5}   {note}", file=out)
    if s["lost"]:
        print(f"  LOST: {', '.join(s['lost'])}", file=out)
    if s["took_effect_twice"]:
        print(f"  TOOK EFFECT TWICE: {', '.join(s['took_effect_twice'])}", file=out)
    print(
        "\n"
        + (
            "OK: every job took effect exactly once."
            if s["ok"]
            else "FAILED: a job was lost or took effect twice."
        ),
        file=out,
        flush=True,
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    setup_django()
    from django.conf import settings

    log = Log(args.quiet)
    run = args.run or next_run()
    print(
        f"django-taskclaim demo: {args.jobs} jobs, {args.agents} agents, each job delivered "
        f"{args.copies}x, lease {args.lease:g}s, work {args.work_seconds:g}s, database "
        f"{_vendor()} ({settings.DATABASES['default']['NAME']})",
        flush=True,
    )
    jobs = request_jobs(run, args.jobs, log)
    demo = Demo(args, log)
    demo.run(jobs)
    summary = summarize(run, jobs, demo.counts)
    summary["errors"] = demo.errors
    for error in demo.errors:
        print(f"error: {error}", file=sys.stderr)
    print_summary(summary)
    if args.json:
        print(json.dumps(summary), flush=True)
    return 0 if summary["ok"] and not demo.errors else 1
