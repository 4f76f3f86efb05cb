"""The run: a database server of its own, W worker processes, the nemesis, the quiet period.

Everything the run needs is started here and stopped at the end: a throwaway PostgreSQL
(``devtools.servers.PostgresServer``; with the ``failover`` fault a primary and its standby,
``devtools.replication.PostgresPair``) or a SQLite file, the schema (``migrate``), the workers
(``tests.chaos.worker``) and the tasks; with ``--downstream`` a downstream service and relays,
with ``--schedules`` scheduler processes (tests/chaos/ticks.py). The nemesis draws every decision
(which fault, which worker, how long) from one ``random.Random(seed)``; the timing of the
processes is not deterministic, so a seed reproduces the fault schedule, not the interleaving.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from devtools.patroni import PatroniCluster
from devtools.processes import Child, Supervisor
from devtools.replication import Failover, PostgresPair
from devtools.servers import MariaDBServer, PostgresServer
from tests.chaos import ticks
from tests.chaos.limits import limit_of

ROOT = Path(__file__).resolve().parents[2]
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
SKEW_SECONDS = 3600
T = TypeVar("T")

# Fault kinds the nemesis draws from, with their weights, and the databases they apply to.
FAULTS: dict[str, tuple[int, tuple[str, ...]]] = {
    "pause": (3, ("sqlite", "postgresql", "mariadb")),
    "kill": (2, ("sqlite", "postgresql", "mariadb")),
    # PostgreSQL only: the nemesis finds a worker's session by application_name, which MySQL lacks.
    "terminate": (2, ("postgresql",)),
    "terminate_in_commit": (2, ("postgresql",)),
    "timeout": (2, ("postgresql",)),
    "restart": (1, ("postgresql",)),
    # Runs on a schedule of its own (--failover-interval), not drawn by weight, and only when
    # asked for: the server becomes a primary with a standby, and every failover replaces one.
    "failover": (0, ("postgresql",)),
}
SCHEDULED = ("failover",)


def applicable_faults(db: str, wanted: tuple[str, ...] | None) -> list[str]:
    """The fault kinds to inject on ``db``: ``wanted`` (all by default) that apply to it."""
    if wanted is not None:
        unknown = sorted(set(wanted) - set(FAULTS))
        if unknown:
            raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; "
                             f"choose from {', '.join(FAULTS)}")
        inapplicable = sorted(k for k in wanted if db not in FAULTS[k][1])
        if inapplicable:
            raise ValueError(f"fault kind(s) {', '.join(inapplicable)} do not apply to {db}")
    return [k for k in FAULTS if db in FAULTS[k][1]
            and (k in wanted if wanted is not None else k not in SCHEDULED)]


@dataclass
class Options:
    duration: float
    workers: int
    seed: int
    db: str
    lease: float = 2.0
    tasks: int | None = None
    steps: int = 3
    work_ms: float = 100.0
    fault_interval: float = 1.0
    crash: str = "after_claim=0.01,before_commit=0.01,after_commit=0.01"
    give_up: float = 0.03
    skew: float = 0.25
    quiet: float | None = None
    faults: tuple[str, ...] | None = None
    failover_interval: float = 20.0
    replication: str = "sync"
    standby_lag: float = 0.0
    #: ``--ha``: who fails over, the harness (``pg_ctl``) or Patroni (``devtools.patroni``).
    ha: str = "pg_ctl"
    #: ``--ha-failures``: under Patroni, how the leader may fail (one drawn per failover).
    ha_failures: tuple[str, ...] = ("kill", "stop", "cut")
    unsafe: bool = False
    #: Tasks each worker has in hand at once (``tests.chaos.worker --concurrency``).
    concurrency: int = 1
    #: ``--downstream``: a downstream service, direct calls and an outbox, relays (tests/chaos/downstream.py).
    downstream: bool = False
    relays: int = 2
    #: ``--limits``: every other task under one of ``limit_keys`` concurrency keys (tests/chaos/limits.py).
    limits: bool = False
    limit_keys: int = 3
    limit: int = 2
    #: ``--schedules``: ``schedulers`` taskclaim_scheduler processes fire a 1 s schedule (tests/chaos/ticks.py).
    schedules: bool = False
    schedulers: int = 3
    keep: bool = False
    verbose: bool = False


@dataclass
class WorkerProc:
    tag: str
    child: Child
    skewed: bool
    started: float
    paused_until: float | None = None
    stopping: bool = False
    #: A ``taskclaim_relay`` process (``--downstream``), not a worker: only paused or killed.
    relay: bool = False
    #: A ``taskclaim_scheduler`` process (``--schedules``), not a worker: only paused or killed.
    scheduler: bool = False

    @property
    def pid(self) -> int:
        return self.child.pid

    @property
    def app_name(self) -> str:
        return f"chaos-{self.tag}"

    def alive(self) -> bool:
        return self.child.alive()

    def send(self, command: str) -> bool:
        return self.child.send(command)


@dataclass
class RunLog:
    """What the harness saw: faults it injected, and every event the workers replied."""

    faults: Counter[str] = field(default_factory=Counter)
    events: list[dict[str, Any]] = field(default_factory=list)
    killed_pids: set[int] = field(default_factory=set)
    skew_observed: list[float] = field(default_factory=list)
    enqueued: list[str] = field(default_factory=list)
    workers_started: int = 0
    quiet_seconds: float = 0.0
    chaos_seconds: float = 0.0
    failovers: list[Failover] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: ``--downstream``: the effect rows the downstream holds at the end, and relays that exited
    #: on their own (a database error under a server fault).
    downstream_effects: list[dict[str, Any]] = field(default_factory=list)
    relay_exits: int = 0
    #: ``--schedules``: the first tick that had a task before the faults began, the tick due when
    #: they ended, and the ticks the schedulers that exited cleanly said they created.
    first_tick: Any = None
    until_tick: Any = None
    ticks_reported: int = 0


class Harness:
    def __init__(self, opts: Options) -> None:
        if opts.db not in ("sqlite", "postgresql", "mariadb"):
            raise ValueError(f"--db must be sqlite, postgresql or mariadb, not {opts.db!r}")
        if opts.replication not in ("sync", "async"):
            raise ValueError(f"--replication must be sync or async, not {opts.replication!r}")
        self.opts = opts
        self.rng = random.Random(opts.seed)
        self.log = RunLog()
        self.rundir = tempfile.mkdtemp(prefix="taskclaim-chaos-")
        self.server: PostgresServer | PostgresPair | PatroniCluster | MariaDBServer | None = None
        self.env: dict[str, str] = {}
        self.workers: list[WorkerProc] = []
        # Each event gets the time it arrived ("seen"): the checker compares it with failovers.
        self.processes = Supervisor(cwd=ROOT, stamp="seen")
        self.worker_of: dict[Child, WorkerProc] = {}
        self.next_tag = 0
        self.lock = threading.Lock()
        self.kinds = applicable_faults(opts.db, opts.faults)
        if (opts.replication != "sync" or opts.standby_lag or opts.ha != "pg_ctl") and "failover" not in self.kinds:
            raise ValueError("--replication, --standby-lag and --ha apply to the failover fault: "
                             "add --faults failover")
        if opts.ha == "patroni" and (opts.standby_lag or "restart" in self.kinds):
            raise ValueError("--ha patroni: Patroni's members stream directly (no --standby-lag), and "
                             "Patroni restarts a crashed server itself (no restart fault)")
        unknown = set(opts.ha_failures) - {"kill", "stop", "cut"}
        if unknown or not opts.ha_failures:
            raise ValueError(f"--ha-failures: kill, stop or cut, not {', '.join(sorted(unknown)) or 'nothing'}")
        self.drawn = [k for k in self.kinds if k not in SCHEDULED]
        # The first faults go through every kind once (in a seeded order), so that even a
        # short run injects each; after that the kinds are drawn by weight.
        self.first = self.rng.sample(self.drawn, len(self.drawn))
        # Held by a failover from the kill until its new standby streams, and by a restart:
        # the server changes shape under one of them at a time.
        self.server_busy = threading.Lock()
        self.failover_thread: threading.Thread | None = None
        self.downstream: Child | None = None
        self.downstream_url = ""
        self.next_relay = 0
        self.next_scheduler = 0
        # A relay's lease, shorter than the pause the nemesis gives a relay: a paused relay
        # wakes after another one has taken its message over (its HTTP timeout + 1.5 s at least).
        self.relay_timeout = 1.5
        self.relay_lease = max(self.relay_timeout + 1.5, 1.5 * opts.lease)
        # A skewed worker's clock must not matter: the database's clock decides (not SQLite's,
        # which is the worker's own).
        self.skew_available = opts.db in ("postgresql", "mariadb") and opts.skew > 0
        if self.skew_available and not os.path.exists(FAKETIME_LIB):
            raise RuntimeError(f"libfaketime not found at {FAKETIME_LIB}: "
                               "apt-get install libfaketime, or pass --skew 0")

    # -- setup ----------------------------------------------------------------------------
    def setup(self) -> None:
        env = {
            "DJANGO_SETTINGS_MODULE": "tests.chaos.settings",
            "TASKCLAIM_TEST_DB": self.opts.db,
            "PYTHONPATH": str(ROOT),
            "CHAOS_SEED": str(self.opts.seed),
            "PGAPPNAME": "chaos-harness",
        }
        if self.opts.schedules:
            env["CHAOS_SCHEDULES"] = json.dumps({ticks.NAME: ticks.SCHEDULE})
        if self.opts.db == "postgresql" and "failover" in self.kinds:
            # Kept before it starts: a start that fails half-way leaves servers for teardown to stop.
            servers: PatroniCluster | PostgresPair
            if self.opts.ha == "patroni":
                servers = PatroniCluster(synchronous=self.opts.replication == "sync")
            else:
                servers = PostgresPair(synchronous=self.opts.replication == "sync", lag=self.opts.standby_lag)
            self.server = servers
            servers.start()
            # Both nodes in HOST and PORT; target_session_attrs through Django's OPTIONS
            # (tests/chaos/settings.py), not libpq's PGTARGETSESSIONATTRS: the way a project
            # configures it.
            env.update({k: v for k, v in self.server.env.items() if k != "PGTARGETSESSIONATTRS"})
            env["CHAOS_TARGET_SESSION_ATTRS"] = "read-write"
            self.log.failovers = self.server.failovers
            env["TASKCLAIM_TEST_DB_NAME"] = "postgres"
        elif self.opts.db == "postgresql":
            self.server = PostgresServer().start()
            env.update(self.server.env)
            env["TASKCLAIM_TEST_DB_NAME"] = "postgres"
        elif self.opts.db == "mariadb":
            self.server = MariaDBServer().start()
            self.server.create_database("chaos")
            env.update(self.server.env)
            env["TASKCLAIM_TEST_DB_NAME"] = "chaos"
        else:
            env["TASKCLAIM_TEST_DB_NAME"] = os.path.join(self.rundir, "chaos.sqlite3")
        self.env = env
        os.environ.update(env)
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        if self.opts.downstream:
            self.start_downstream()  # it migrates its own database meanwhile
        if self.opts.schedules and self.opts.db != "sqlite":
            # Started while the schema is made (they boot meanwhile, and go on past the database
            # errors of the first rounds); on SQLite after, so as not to hold the file's lock.
            self.start_schedulers()
        call_command("migrate", verbosity=0)
        if self.opts.db == "sqlite":
            with connection.cursor() as cursor:
                # Readers never wait for the writer; the mode is stored in the file.
                cursor.execute("PRAGMA journal_mode=WAL")
            if self.opts.schedules:
                self.start_schedulers()
        if self.downstream is not None:
            ready = self.downstream.event("ready", timeout=120)
            self.downstream_url = f"http://127.0.0.1:{ready['port']}"

    def start_downstream(self) -> None:
        """The downstream service, a process of its own on its own SQLite file; never faulted."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASKCLAIM_TEST_DB")}
        self.downstream = self.processes.start(
            "tests.chaos.downstream", os.path.join(self.rundir, "downstream.sqlite3"),
            env=env, stderr=os.path.join(self.rundir, "downstream.stderr"))

    def downstream_report(self) -> list[dict[str, Any]]:
        """Every effect row the downstream holds (asked over its stdin)."""
        assert self.downstream is not None
        self.downstream.send("report")
        return list(self.downstream.event("report", timeout=60)["effects"])

    def start_relay(self) -> WorkerProc:
        tag = f"r{self.next_relay}"
        self.next_relay += 1
        env = {**os.environ, **self.env, "PGAPPNAME": f"chaos-{tag}"}
        child = self.processes.start(
            "django", "taskclaim_relay", "--lease", str(self.relay_lease),
            "--timeout", str(self.relay_timeout), "--backoff", "0.2", "--max-attempts", "100000",
            "--batch", "5",
            env=env, stderr=os.path.join(self.rundir, f"{tag}.stderr"))
        relay = WorkerProc(tag=tag, child=child, skewed=False, started=time.monotonic(), relay=True)
        self.worker_of[child] = relay
        self.workers.append(relay)
        return relay

    def start_scheduler(self, skewed: bool = False) -> WorkerProc:
        """A ``taskclaim_scheduler`` process of ``--schedules``; ``skewed``: its clock ahead (libfaketime)."""
        tag = f"s{self.next_scheduler}"
        self.next_scheduler += 1
        env = {**os.environ, **self.env, "PGAPPNAME": f"chaos-{tag}"}
        if skewed:
            # The scheduler's sleeps are on the monotonic clock: left alone.
            env.update(LD_PRELOAD=FAKETIME_LIB, FAKETIME=ticks.SKEW, FAKETIME_DONT_FAKE_MONOTONIC="1")
            self.log.faults["skewed_scheduler"] += 1
        child = self.processes.start("django", "taskclaim_scheduler", "--json", env=env,
                                     stderr=os.path.join(self.rundir, f"{tag}.stderr"))
        scheduler = WorkerProc(tag=tag, child=child, skewed=skewed, started=time.monotonic(), scheduler=True)
        self.worker_of[child] = scheduler
        self.workers.append(scheduler)
        return scheduler

    def start_schedulers(self) -> None:
        for i in range(self.opts.schedulers):
            # The first one's clock runs ahead where the database's clock decides.
            self.start_scheduler(skewed=self.skew_available and i == 0)

    def wait_for_first_tick(self) -> None:
        """Until the schedule's first tick has a task (the faults begin after it), reading events."""
        end = time.monotonic() + 60
        while time.monotonic() < end:
            self.drain_events()
            self.replace_dead()
            fired = self.db(ticks.ticks_fired)
            if fired:
                self.log.first_tick = fired[0]
                return
            time.sleep(0.1)  # poll the task table for the first tick
        self.log.errors.append("no scheduler fired a tick within 60 s of their start")

    def stop_schedulers(self) -> None:
        """Wait until the tick due now has a task, then SIGTERM the schedulers and read their reports."""
        from django_taskclaim.models import Task

        until = self.db(ticks.newest_due)
        self.log.until_tick = until
        key = ticks.schedule().key(until)
        end = time.monotonic() + 30
        # Not found within the deadline: the checker reports the tick missing.
        while time.monotonic() < end and not self.db(lambda: Task.objects.filter(key=key).exists()):
            self.drain_events()
            self.replace_dead()
            time.sleep(0.1)  # poll for the tick's task
        schedulers = [w for w in self.workers if w.scheduler and not w.stopping]
        for scheduler in schedulers:
            scheduler.stopping = True
            scheduler.child.signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for scheduler in schedulers:
            try:
                code = scheduler.child.wait(max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                self.log.errors.append(f"scheduler {scheduler.tag} did not stop on SIGTERM; killed")
                scheduler.child.kill()
                scheduler.child.wait(30)
                continue
            # -SIGTERM: a replacement still starting up, before the command set its handler.
            if code not in (0, -signal.SIGTERM):
                self.log.errors.append(f"scheduler {scheduler.tag} exited with code {code} on SIGTERM "
                                       f"(see {self.rundir}/{scheduler.tag}.stderr)")
            scheduler.child.ended(10)  # its report read
        self.drain_events()

    def db(self, fn: Callable[[], T], deadline: float = 120.0) -> T:
        """Run a query of the harness itself, reconnecting while the server restarts."""
        from django.db import Error, connection

        end = time.monotonic() + deadline
        while True:
            try:
                return fn()
            except Error:
                connection.close()
                if time.monotonic() > end:
                    raise
                time.sleep(0.2)  # back-off while the server is down

    # -- workers --------------------------------------------------------------------------
    def start_worker(self, skewed: bool | None = None) -> WorkerProc:
        tag = f"w{self.next_tag}"
        self.next_tag += 1
        if skewed is None:
            skewed = self.skew_available and self.rng.random() < self.opts.skew
        env = {**os.environ, **self.env, "PGAPPNAME": f"chaos-{tag}",
               "CHAOS_CRASH": self.opts.crash}
        if skewed:
            # FORCE_MONOTONIC_FIX: without it, libfaketime 0.9.10 breaks clock_nanosleep, so
            # time.sleep() fails with EINVAL (monotonic time is offset too, harmlessly).
            env.update(LD_PRELOAD=FAKETIME_LIB, FAKETIME=f"+{SKEW_SECONDS // 3600}h",
                       FAKETIME_FORCE_MONOTONIC_FIX="1")
        child = self.processes.start(
            "tests.chaos.worker", "--tag", tag, "--lease", str(self.opts.lease), "--steps", str(self.opts.steps),
            "--work-ms", str(self.opts.work_ms), "--give-up", str(self.opts.give_up),
            "--concurrency", str(self.opts.concurrency),
            *(["--unsafe"] if self.opts.unsafe else []),
            *(["--mark-start"] if self.opts.limits else []),
            *(["--downstream", self.downstream_url] if self.opts.downstream else []),
            env=env, stderr=os.path.join(self.rundir, f"{tag}.stderr"),
        )
        worker = WorkerProc(tag=tag, child=child, skewed=skewed, started=time.monotonic())
        self.worker_of[child] = worker
        self.workers.append(worker)
        self.log.workers_started += 1
        if skewed:
            self.log.faults["skewed_worker"] += 1
        return worker

    def drain_events(self) -> None:
        while (got := self.processes.next(0)) is not None:
            child, event = got
            if child is self.downstream:
                continue  # read through its own cursor
            worker = self.worker_of[child]
            if worker.scheduler:  # its only output: what it created, or its error, on exit (--json)
                if isinstance(event.get("fired"), int):
                    self.log.ticks_reported += event["fired"]
                elif "error" in event:
                    self.log.errors.append(f"scheduler {worker.tag}: {event['error']}")
                continue
            event.update(tag=worker.tag, pid=worker.pid, skewed=worker.skewed)
            self.log.events.append(event)
            kind = event.get("event")
            if kind == "crash":
                self.log.faults[f"crash_{event['point']}"] += 1
                self.log.killed_pids.add(event["pid"])
            elif kind == "start":
                self.log.skew_observed.append(event["wall"] - event["seen"])
                if event["skewed"] != (event["wall"] - event["seen"] > SKEW_SECONDS / 2):
                    self.log.errors.append(
                        f"worker {event['tag']} skewed={event['skewed']} but its clock is off by "
                        f"{event['wall'] - event['seen']:.0f} s")
            elif self.opts.verbose and kind in ("stale", "abandon"):
                print(f"  {event}", flush=True)

    def live_workers(self) -> list[WorkerProc]:
        return [w for w in self.workers if w.alive() and not w.stopping]

    def replace_dead(self) -> None:
        for worker in list(self.workers):
            if not worker.stopping and not worker.alive():
                worker.stopping = True  # counted once
                if worker.relay:
                    # A relay exits on a database error it does not retry (a terminated session,
                    # a restart): counted, and replaced like a killed one.
                    if worker.child.returncode != -signal.SIGKILL:
                        self.log.relay_exits += 1
                    self.start_relay()
                    continue
                if worker.scheduler:
                    # It survives database errors (the loop goes on): any exit but a SIGKILL is one.
                    if worker.child.returncode != -signal.SIGKILL:
                        self.log.errors.append(
                            f"scheduler {worker.tag} exited with code {worker.child.returncode} "
                            f"(see {self.rundir}/{worker.tag}.stderr)")
                    self.start_scheduler()
                    continue
                if worker.child.returncode != -signal.SIGKILL:
                    self.log.errors.append(
                        f"worker {worker.tag} exited with code {worker.child.returncode} "
                        f"(see {self.rundir}/{worker.tag}.stderr)")
                self.start_worker()

    # -- tasks ----------------------------------------------------------------------------
    def top_up(self) -> None:
        from django_taskclaim.models import Task

        cap = self.opts.tasks
        if cap is not None and len(self.log.enqueued) >= cap:
            return
        backlog = self.db(lambda: Task.objects.pending().count())
        want = 4 * self.opts.workers * self.opts.concurrency - backlog
        if cap is not None:
            want = min(want, cap - len(self.log.enqueued))
        for _ in range(max(want, 0)):
            n = len(self.log.enqueued)
            key = f"chaos:{self.opts.seed}:{n}"
            limited = limit_of(n, self.opts.limit_keys, self.opts.limit) if self.opts.limits else {}
            self.db(partial(Task.objects.ensure, key, max_attempts=100_000, queue="default", **limited))
            self.log.enqueued.append(key)

    # -- the nemesis ----------------------------------------------------------------------
    def nemesis(self) -> None:
        if not self.drawn:
            return
        weights = [FAULTS[k][0] for k in self.drawn]
        kind = self.first[0] if self.first else self.rng.choices(self.drawn, weights)[0]
        candidates = [w for w in self.live_workers() if w.paused_until is None
                      and (kind in ("pause", "kill") or not (w.relay or w.scheduler))]
        # The first pause and the first kill go to a scheduler, so that a short run hits them too.
        schedulers = [w for w in candidates if w.scheduler]
        if schedulers and kind in ("pause", "kill") and not self.log.faults[f"scheduler_{kind}"]:
            candidates = schedulers
        if kind != "restart" and not candidates:
            return
        target = self.rng.choice(candidates) if candidates else None
        counter = "terminate_in_commit_tried" if kind == "terminate_in_commit" else kind
        before = self.log.faults[counter]
        getattr(self, f"fault_{kind}")(target)
        # A kind of the first round leaves it only once injected: on a loaded machine a worker
        # may have no session to terminate yet, and a short run must still see every kind.
        if self.first and self.first[0] == kind and self.log.faults[counter] > before:
            self.first.pop(0)

    def fault_pause(self, worker: WorkerProc) -> None:
        if worker.relay:  # past the relay's lease: another relay sends its messages again
            seconds = self.rng.uniform(1.2, 2) * self.relay_lease
            self.log.faults["relay_pause"] += 1
        else:
            seconds = self.rng.uniform(2, 3) * self.opts.lease
            if worker.scheduler:
                self.log.faults["scheduler_pause"] += 1
        worker.child.stop()
        worker.paused_until = time.monotonic() + seconds
        # Resumed by a timer, not by the main loop: on SQLite a worker paused inside its write
        # transaction holds the database lock, and the harness's own queries wait for it.
        timer = threading.Timer(seconds, self.resume, args=(worker,))
        timer.daemon = True
        timer.start()
        self.log.faults["pause"] += 1

    def scheduler_outage(self) -> None:
        """SIGSTOP every running scheduler for one 2-3 x the lease: nobody fires the ticks due
        meanwhile, and the first one to wake up must fire each of them (``catch_up: all``)."""
        seconds = self.rng.uniform(2, 3) * self.opts.lease
        for worker in self.live_workers():
            if worker.scheduler and worker.paused_until is None:
                worker.child.stop()
                worker.paused_until = time.monotonic() + seconds
                timer = threading.Timer(seconds, self.resume, args=(worker,))
                timer.daemon = True
                timer.start()
        self.log.faults["scheduler_outage"] += 1

    def resume(self, worker: WorkerProc) -> None:
        with self.lock:
            if worker.paused_until is not None:
                worker.child.cont()
                worker.paused_until = None

    def resume_due(self, everyone: bool = False) -> None:
        for worker in list(self.workers):
            due = worker.paused_until is not None and time.monotonic() >= worker.paused_until
            if worker.paused_until is not None and (everyone or due):
                self.resume(worker)

    def fault_kill(self, worker: WorkerProc) -> None:
        worker.child.kill()
        self.log.killed_pids.add(worker.pid)
        self.log.faults["kill"] += 1
        if worker.relay:
            self.log.faults["relay_kill"] += 1
        if worker.scheduler:
            self.log.faults["scheduler_kill"] += 1

    def _terminate(self, column: str, value: Any) -> int:
        from django.db import connection

        sql = {
            "application_name": "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE application_name = %s",
            "pid": "SELECT pg_terminate_backend(%s)",
        }[column]

        def run() -> int:
            with connection.cursor() as cursor:
                cursor.execute(sql, [value])
                return sum(1 for (ok,) in cursor.fetchall() if ok)

        return self.db(run)

    def fault_terminate(self, worker: WorkerProc) -> None:
        # A worker that is reconnecting (after a restart, say) has no session for a moment.
        end = time.monotonic() + 2.0
        while time.monotonic() < end and worker.alive():
            if self._terminate("application_name", worker.app_name):
                self.log.faults["terminate"] += 1
                return
            time.sleep(0.01)  # poll pg_stat_activity

    def fault_terminate_in_commit(self, worker: WorkerProc) -> None:
        """Terminate whichever worker is first seen inside a fenced transaction.

        ``idle in transaction`` with the completion as its last statement: the effect and the
        completion are written, the COMMIT is next (or under way).
        """
        from django.db import connection

        self.log.faults["terminate_in_commit_tried"] += 1
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            def find() -> list[int]:
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s "
                        "AND state IN ('idle in transaction', 'active') AND xact_start IS NOT NULL "
                        "AND query LIKE %s", ["chaos-w%", "%status = 'succeeded'%"])
                    return [pid for (pid,) in cursor.fetchall()]

            pids = self.db(find)
            if pids:
                if self._terminate("pid", pids[0]):
                    self.log.faults["terminate_in_commit"] += 1
                return

    def fault_timeout(self, worker: WorkerProc) -> None:
        if worker.send("timeout"):
            self.log.faults["timeout"] += 1

    def fault_restart(self, worker: WorkerProc | None) -> None:
        assert isinstance(self.server, PostgresServer | PostgresPair)
        from django.db import connection

        if not self.server_busy.acquire(blocking=False):
            return  # a failover is under way
        try:
            connection.close()
            self.server.restart("immediate")
            self.log.faults["restart"] += 1
        finally:
            self.server_busy.release()

    def start_failover(self) -> None:
        """Fail the primary over on a thread: the nemesis and the event reading go on meanwhile."""
        self.server_busy.acquire()
        # Under Patroni, the leader's machine SIGKILLed, hung (SIGSTOP) or cut from etcd (its agent
        # demotes it), the last two killed once another member is promoted; drawn here, on the
        # nemesis's thread, to keep the seeded sequence.
        how = self.rng.choice(self.opts.ha_failures) if isinstance(self.server, PatroniCluster) else "kill"
        self.failover_thread = threading.Thread(target=self.failover, args=(how,), name="failover", daemon=True)
        self.failover_thread.start()

    def failover(self, how: str = "kill") -> None:
        """SIGKILL the primary, promote the standby, build a new standby from the new primary
        (under Patroni: fail the leader's machine or its network to etcd, ``how``, and let Patroni
        promote)."""
        assert isinstance(self.server, PostgresPair | PatroniCluster)
        try:
            record = self.server.failover(how) if isinstance(self.server, PatroniCluster) else self.server.failover()
            if self.opts.verbose and record.standby_ready is not None:
                print(f"  failover ({record.how}) to {record.new_primary}: writable after {record.unavailable:.2f} s, "
                      f"new standby after {record.standby_ready - record.killed:.2f} s", flush=True)
        except (RuntimeError, TimeoutError, OSError) as exc:
            self.log.errors.append(f"failover failed: {exc}")
        finally:
            # The pair records a failover once the standby is promoted, rebuilt or not.
            self.log.faults["failover"] = len(self.server.failovers)
            self.server_busy.release()

    def failover_due(self, start: float) -> float:
        """When the next failover starts: about ``--failover-interval`` after ``start``."""
        return start + self.rng.uniform(0.5, 1.5) * self.opts.failover_interval

    # -- phases ---------------------------------------------------------------------------
    def chaos(self) -> None:
        opts = self.opts
        skewed_first = self.skew_available
        for i in range(opts.workers):
            self.start_worker(skewed=True if (skewed_first and i == 0) else None)
        for _ in range(opts.relays if opts.downstream else 0):
            self.start_relay()
        if opts.schedules:
            self.wait_for_first_tick()
        start = time.monotonic()
        end = start + opts.duration
        next_fault = start + self.rng.expovariate(1 / opts.fault_interval)
        next_failover: float | None = None
        # --schedules: once, from half-way, every scheduler paused at once (the missed ticks are caught
        # up), after the first pause and kill of a scheduler (they need a scheduler running).
        outage: float | None = start + opts.duration / 2 if opts.schedules else None
        last_report = start
        next_sweep = start + opts.lease
        while time.monotonic() < end:
            self.drain_events()
            self.resume_due()
            self.replace_dead()
            self.top_up()
            now = time.monotonic()
            if now >= next_sweep:
                # What `manage.py taskclaim_reclaim --every` does, racing the workers' takeovers.
                self.sweep()
                next_sweep = now + opts.lease
            if outage is not None and now >= outage and all(
                    self.log.faults[f"scheduler_{kind}"] for kind in ("pause", "kill") if kind in self.drawn):
                self.scheduler_outage()
                outage = None
            if now >= next_fault:
                self.nemesis()
                next_fault = time.monotonic() + self.rng.expovariate(1 / opts.fault_interval)
            if "failover" in self.kinds and not self.failing_over():
                if next_failover is None and self.workers_ready():
                    next_failover = self.failover_due(now)  # counted from the end of the last one
                elif next_failover is not None and now >= next_failover:
                    self.start_failover()
                    next_failover = None
            if now - last_report >= 30:
                last_report = now
                print(f"  {now - start:5.0f} s: {len(self.log.enqueued)} tasks enqueued, faults "
                      f"{dict(self.log.faults)}", flush=True)
            time.sleep(0.05)  # the nemesis's tick
        self.join_failover()
        self.log.chaos_seconds = time.monotonic() - start

    def workers_ready(self) -> bool:
        """Whether the first workers are all at work (a failover before that would hit nobody)."""
        return sum(1 for e in self.log.events if e.get("event") == "start") >= self.opts.workers

    def failing_over(self) -> bool:
        return self.failover_thread is not None and self.failover_thread.is_alive()

    def join_failover(self) -> None:
        """Let a failover under way finish (its new standby streaming), reading events meanwhile."""
        while self.failing_over():
            self.drain_events()
            self.resume_due()
            self.replace_dead()
            assert self.failover_thread is not None
            self.failover_thread.join(0.1)

    def sweep(self) -> None:
        from django_taskclaim.models import Task

        self.log.faults["reclaim_sweeps"] += 1
        self.db(lambda: Task.objects.reclaim_expired())

    def quiet(self) -> None:
        """No more faults: resume everyone, sweep expired leases, let the survivors finish."""
        from django_taskclaim.models import Task

        self.resume_due(everyone=True)
        if self.opts.schedules:
            self.stop_schedulers()  # no new tick once the quiet period begins
        start = time.monotonic()
        limit = self.opts.quiet if self.opts.quiet is not None else max(60.0, 20 * self.opts.lease)
        while time.monotonic() - start < limit:
            self.drain_events()
            self.replace_dead()
            self.sweep()
            if not self.db(lambda: Task.objects.unfinished().exists()) and not self.undelivered():
                break
            time.sleep(self.opts.lease / 4)  # sweep interval; leases are what we wait for
        self.log.quiet_seconds = time.monotonic() - start
        for worker in self.workers:
            if worker.scheduler:
                continue  # stopped already
            worker.stopping = True
            if worker.relay:
                worker.child.signal(signal.SIGTERM)  # a relay stops after the message in hand
            else:
                worker.send("stop")
        deadline = time.monotonic() + 30
        for worker in self.workers:
            try:
                worker.child.wait(max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                self.log.errors.append(f"worker {worker.tag} did not stop when told; killed")
                worker.child.kill()
                worker.child.wait(30)
        for worker in self.workers:
            worker.child.ended(10)  # its last events read
        self.drain_events()
        if self.downstream is not None:
            self.log.downstream_effects = self.downstream_report()

    def undelivered(self) -> bool:
        """Whether an outbox message is still pending (``--downstream``): the relays are not done."""
        if not self.opts.downstream:
            return False
        from django_taskclaim.models import OutboxMessage

        return self.db(lambda: OutboxMessage.objects.filter(status="pending").exists())

    def teardown(self, ok: bool) -> None:
        if self.failover_thread is not None:
            self.failover_thread.join(120)
        self.processes.close()  # the workers still running: resumed if paused, then killed
        from django.conf import settings
        from django.db import connection

        if settings.configured:  # not yet if the servers failed to start
            connection.close()
        keep = not ok or self.opts.keep
        if keep and isinstance(self.server, PatroniCluster):
            self.server.keep_logs(self.rundir)
        if keep and isinstance(self.server, PostgresPair):
            for node in self.server.nodes:  # the server logs go with the servers otherwise
                with contextlib.suppress(OSError):
                    shutil.copy(node.log, os.path.join(self.rundir, f"{node.name}.log"))
        if self.server is not None:
            self.server.stop()
        if not keep:
            shutil.rmtree(self.rundir, ignore_errors=True)
        else:
            print(f"worker and server logs kept in {self.rundir}", flush=True)
