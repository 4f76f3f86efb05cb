"""The Celery variant (``--celery``): real ``celery worker`` processes, a real Redis or RabbitMQ
broker (``--broker``).

Tasks go in through ``enqueue_once`` and run as a ``claimed_task`` of the bridge
(``django_taskclaim.celery``), each effect and the completion written inside
``self.claim.fenced()``. The nemesis pauses and kills pool processes, kills whole workers
(a replacement starts), restarts the broker, and on PostgreSQL terminates the workers' database
sessions. Redis restarts without persistence: every queued message is lost. RabbitMQ is
killed (SIGKILL) and started again on its data: durable queues keep their persistent
messages, and every unacknowledged delivery comes back. Redis's visibility timeout and
RabbitMQ's ``consumer_timeout`` are shorter than a pause, so both brokers also redeliver the
messages of paused workers (and Celery stops a worker whose channel RabbitMQ closed for it:
a replacement starts). The sweeper
(what ``manage.py taskclaim_reclaim --requeue --every`` does in production) moves expired leases back
and re-sends the messages of tasks that nobody is going to run. The checker is the same.
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import sys
import threading
import time
from typing import Any

from devtools.events import parse
from devtools.processes import send
from tests.chaos.checker import Verdict, table
from tests.chaos.harness import ROOT, Harness, Options, WorkerProc
from tests.chaos.run import build, drive

CELERY_FAULTS: dict[str, tuple[int, tuple[str, ...]]] = {
    "pause": (3, ("sqlite", "postgresql")),
    "kill": (3, ("sqlite", "postgresql")),
    "kill_worker": (1, ("sqlite", "postgresql")),
    "broker_restart": (1, ("sqlite", "postgresql")),
    "terminate": (2, ("postgresql",)),
}
CELERY_LABELS = [
    ("pause", "SIGSTOP of a pool process for 2-3x the lease"),
    ("kill", "SIGKILL of a pool process (task redelivered)"),
    ("kill_worker", "SIGKILL of a whole worker (a replacement starts)"),
    ("broker_restart", "broker restart (queued messages lost)"),
    ("terminate", "pg_terminate_backend of a worker's sessions"),
    ("requeued", "messages re-sent by the sweeper"),
    ("worker_died_on_broker_loss", "workers that died of a broker loss (restarted)"),
    ("worker_died_on_pool_start", "workers Celery ended as a pool process died at start"),
    ("worker_stopped_on_consumer_timeout", "workers stopped by RabbitMQ's consumer_timeout"),
    ("worker_hung_in_shutdown", "workers killed after a hung warm shutdown"),
]


def children(pid: int) -> list[int]:
    """Pool processes of a worker: the processes whose parent is ``pid``."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.split("/")[2]))
    return found


def lost_broker(log: str) -> bool:
    """Whether a worker's log shows it lost (or could not reach) its broker."""
    return "Connection to broker lost" in log or "Cannot connect to" in log


def proc_state(pid: int) -> str:
    """A process's state letter and kernel wait channel (for a report on a hung worker)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/wchan") as f:
            return f"{state}/{f.read().strip() or '-'}"
    except OSError:
        return "gone"


class CeleryHarness(Harness):
    def __init__(self, opts: Options, broker: str = "redis") -> None:
        super().__init__(opts)
        self.kinds = [k for k, (_, dbs) in CELERY_FAULTS.items() if opts.db in dbs]
        self.first = self.rng.sample(self.kinds, len(self.kinds))
        self.skew_available = False
        self.paused: dict[int, float] = {}  # pool process pid -> resume at
        self.events_dir = os.path.join(self.rundir, "events")
        os.makedirs(self.events_dir)
        from devtools.servers import RabbitMQServer, RedisServer

        self.broker_kind = broker
        if broker == "rabbitmq":
            # Shorter than a pause (2-3 leases), checked every second: paused deliveries come back.
            timeout_ms = int(1.5 * opts.lease * 1000)
            self.broker: Any = RabbitMQServer(config={"consumer_timeout": str(timeout_ms)}).start()
        else:
            self.broker = RedisServer().start()
        self.app: Any = None
        self.task: Any = None
        self.restarting: threading.Thread | None = None  # RabbitMQ boots for seconds: in a thread

    def setup(self) -> None:
        os.environ.update(CHAOS_BROKER_URL=self.broker.url, CHAOS_LEASE=str(self.opts.lease),
                          CHAOS_STEPS=str(self.opts.steps), CHAOS_WORK_MS=str(self.opts.work_ms),
                          CHAOS_EVENTS=self.events_dir)
        super().setup()
        from tests.chaos import celery_app

        self.app, self.task = celery_app.app, celery_app.step_task

    def start_worker(self, skewed: bool | None = None) -> WorkerProc:
        tag = f"c{self.next_tag}"
        self.next_tag += 1
        env = {**os.environ, **self.env, "PGAPPNAME": f"chaos-{tag}"}
        # The worker leads a process group: its signals reach its pool processes too.
        child = self.processes.start(
            "celery", "-A", "tests.chaos.celery_app", "worker", "--pool", "prefork", "--concurrency", "2",
            "--loglevel", "WARNING", "-n", f"{tag}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
            env=env, group=True, stderr=os.path.join(self.rundir, f"{tag}.log"),
        )
        worker = WorkerProc(tag=tag, child=child, skewed=False, started=time.monotonic())
        self.workers.append(worker)
        self.log.workers_started += 1
        return worker

    def replace_dead(self) -> None:
        for worker in list(self.workers):
            if not worker.stopping and not worker.alive():
                worker.stopping = True
                if worker.pid not in self.log.killed_pids:
                    with open(os.path.join(self.rundir, f"{worker.tag}.log")) as f:
                        log = f.read()
                    if "Unrecoverable error" in log and "delivery acknowledgement on channel" in log:
                        # RabbitMQ closed the channel of a delivery unacknowledged past
                        # consumer_timeout (a paused pool process): Celery stops the worker.
                        self.log.faults["worker_stopped_on_consumer_timeout"] += 1
                    elif "Could not start worker processes" in log:
                        # Celery ends the worker when a pool process dies while the worker
                        # starts or reconnects to its broker (the nemesis killed one). The
                        # worker exits and its supervisor restarts it: counted, not ours.
                        self.log.faults["worker_died_on_pool_start"] += 1
                    elif "Unrecoverable error" in log and lost_broker(log):
                        # Celery/kombu's Redis transport sometimes gives up after the broker
                        # went away twice (celery/celery#8030, #10205): the worker exits and
                        # its supervisor restarts it. Counted, not a violation of ours.
                        self.log.faults["worker_died_on_broker_loss"] += 1
                    else:
                        self.log.errors.append(f"celery worker {worker.tag} exited with code "
                                               f"{worker.child.returncode} (see {self.rundir})")
                self.start_worker()

    def top_up(self) -> None:
        from django_taskclaim import celery as bridge
        from django_taskclaim.models import Task

        backlog = self.db(lambda: Task.objects.pending().count())
        want = 4 * self.opts.workers - backlog
        if self.opts.tasks is not None:
            want = min(want, self.opts.tasks - len(self.log.enqueued))
        for _ in range(max(want, 0)):
            key = f"chaos:{self.opts.seed}:{len(self.log.enqueued)}"
            self.db(lambda key=key: bridge.enqueue_once(self.task, key=key, kwargs={"key": key}))
            self.log.enqueued.append(key)

    def sweep(self, older_than: float) -> None:
        from django_taskclaim import celery as bridge
        from django_taskclaim.claims import reclaim_expired_rows

        def run() -> int:
            sent = bridge.requeue_lost(reclaim_expired_rows(), older_than=older_than, app=self.app)
            return len(sent)

        self.log.faults["requeued"] += self.db(run)

    def pool(self) -> list[int]:
        pids = [pid for w in self.live_workers() for pid in children(w.pid)]
        return [pid for pid in pids if pid not in self.paused]

    def nemesis(self) -> None:
        kind = self.first.pop(0) if self.first else self.rng.choices(
            self.kinds, [CELERY_FAULTS[k][0] for k in self.kinds])[0]
        pool = sorted(self.pool())
        workers = self.live_workers()
        if kind in ("pause", "kill") and pool:
            pid = self.rng.choice(pool)
            if kind == "pause":
                seconds = self.rng.uniform(2, 3) * self.opts.lease
                send(pid, signal.SIGSTOP)
                self.paused[pid] = time.monotonic() + seconds
                # A timer resumes it even while the harness waits on a lock the process holds.
                timer = threading.Timer(seconds, self.resume_pid, args=(pid,))
                timer.daemon = True
                timer.start()
            else:
                send(pid, signal.SIGKILL)
                self.log.killed_pids.add(pid)
            self.log.faults[kind] += 1
        elif kind == "kill_worker" and workers:
            worker = self.rng.choice(workers)
            self.log.killed_pids.update([worker.pid, *children(worker.pid)])
            worker.child.kill()
            self.log.faults[kind] += 1
        elif kind == "broker_restart":
            if self.broker_kind == "rabbitmq":
                if self.restarting is not None and self.restarting.is_alive():
                    return  # still booting from the last one
                self.broker.kill()  # a crash: what it had not written down is gone
                # The node takes seconds to boot: the nemesis goes on meanwhile.
                self.restarting = threading.Thread(target=self.start_broker, daemon=True)
                self.restarting.start()
            else:
                self.broker.restart()
            self.log.faults[kind] += 1
        elif kind == "terminate" and workers:
            # Django closes a pool process's connection after each task (CONN_MAX_AGE = 0):
            # wait a moment for the worker to hold a session.
            worker = self.rng.choice(workers)
            self.log.faults["terminate_tried"] += 1
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                if self._terminate("application_name", worker.app_name):
                    self.log.faults[kind] += 1
                    break
                time.sleep(0.01)  # poll pg_stat_activity

    def resume_pid(self, pid: int) -> None:
        with self.lock:
            if self.paused.pop(pid, None) is not None:
                send(pid, signal.SIGCONT)

    def resume_due(self, everyone: bool = False) -> None:
        for pid, until in list(self.paused.items()):
            if everyone or time.monotonic() >= until:
                self.resume_pid(pid)

    def chaos(self) -> None:
        opts = self.opts
        for _ in range(opts.workers):
            self.start_worker()
        start = time.monotonic()
        end = start + opts.duration
        next_fault = start + 3 + self.rng.expovariate(1 / opts.fault_interval)  # workers boot
        next_sweep = start + opts.lease
        while time.monotonic() < end:
            self.resume_due()
            self.replace_dead()
            self.top_up()
            now = time.monotonic()
            if now >= next_fault:
                self.nemesis()
                next_fault = time.monotonic() + self.rng.expovariate(1 / opts.fault_interval)
            if now >= next_sweep:
                self.sweep(older_than=4 * opts.lease)
                next_sweep = now + opts.lease
            time.sleep(0.05)  # the nemesis's tick
        self.log.chaos_seconds = time.monotonic() - start

    def start_broker(self) -> None:
        try:
            self.broker.start()
        except RuntimeError as exc:
            self.log.errors.append(f"rabbitmq-server did not start again: {exc}")

    def broker_up(self) -> None:
        if self.restarting is not None:
            self.restarting.join(120)

    def quiet(self) -> None:
        from django_taskclaim.models import Task

        self.broker_up()
        self.resume_due(everyone=True)
        start = time.monotonic()
        limit = self.opts.quiet if self.opts.quiet is not None else max(90.0, 30 * self.opts.lease)
        while time.monotonic() - start < limit:
            self.replace_dead()
            self.sweep(older_than=4 * self.opts.lease)
            if not self.db(lambda: Task.objects.unfinished().exists()):
                break
            time.sleep(self.opts.lease / 2)  # sweep interval; leases are what we wait for
        self.log.quiet_seconds = time.monotonic() - start
        for worker in self.workers:
            worker.stopping = True
            worker.child.signal(signal.SIGTERM)  # warm shutdown: finish and ack
        deadline = time.monotonic() + 30
        for worker in self.workers:
            try:
                worker.child.wait(max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                states = ", ".join(f"{pid}:{proc_state(pid)}" for pid in [worker.pid, *children(worker.pid)])
                with open(os.path.join(self.rundir, f"{worker.tag}.log")) as f:
                    log = f.read()
                if lost_broker(log) or "Unrecoverable error" in log:
                    # Seen on RabbitMQ (in one 2-minute run, and one of seven 12 s runs): a worker that lost its
                    # broker connection (or was stopping after Celery's "unrecoverable" closed
                    # channel) never finishes its warm shutdown: the main process waits for a
                    # pool process, which waits to write its last result into a pipe that
                    # nobody reads any more. Its tasks are settled in the database (the checker
                    # below decides); a supervisor's stop timeout kills it, as done here.
                    self.log.faults["worker_hung_in_shutdown"] += 1
                    print(f"  celery worker {worker.tag} hung in its warm shutdown; killed "
                          f"(process states {states})", flush=True)
                else:
                    self.log.errors.append(f"celery worker {worker.tag} did not stop; killed "
                                           f"(process states {states})")
                worker.child.kill()
                worker.child.wait(60)
        for path in sorted(glob.glob(os.path.join(self.events_dir, "*.jsonl"))):
            with open(path) as f:
                self.log.events.extend(parse(f))  # a line cut short by SIGKILL is left out

    def teardown(self, ok: bool) -> None:
        self.broker_up()
        self.resume_due(everyone=True)
        self.processes.close()  # the workers still running and their pools
        self.broker.stop()
        super().teardown(ok)


def run_celery(args: argparse.Namespace) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.chaos.settings")
    try:
        import celery  # noqa: F401
    except ImportError:
        print("error: --celery needs the 'celery' and 'redis' packages", file=sys.stderr)
        return 2
    if not os.path.exists(os.path.join(ROOT, "django_taskclaim", "celery.py")):
        print("error: --celery needs the Celery bridge (django_taskclaim/celery.py), which this "
              "checkout does not have", file=sys.stderr)
        return 2
    opts = Options(duration=args.duration, workers=args.workers, seed=args.seed, db=args.db,
                   lease=args.lease, tasks=args.tasks, steps=args.steps, work_ms=args.work_ms,
                   fault_interval=args.fault_interval, crash="", skew=0.0, quiet=args.quiet,
                   keep=args.keep, verbose=args.verbose)
    harness = build(lambda o: CeleryHarness(o, broker=args.broker), opts)
    if harness is None:
        return 2

    def render(verdict: Verdict) -> str:
        log = harness.log
        header = (f"django-taskclaim fault injection, Celery variant: {opts.db}, {args.broker}, seed {opts.seed}, "
                  f"{opts.workers} workers, lease {opts.lease} s, {log.chaos_seconds:.0f} s of "
                  f"faults + {log.quiet_seconds:.0f} s quiet, {log.workers_started} workers")
        lines = table(log.faults, verdict, header, [], False, "").split("\n")
        start = lines.index("faults injected") + 1
        end = lines.index("run") - 1
        tried = {"terminate": f"  (of {log.faults['terminate_tried']} tried)"}
        labels = dict(CELERY_LABELS)
        counted = ["requeued", "worker_died_on_broker_loss", "worker_died_on_pool_start",
                   "worker_hung_in_shutdown"]
        if args.broker == "rabbitmq":
            labels["broker_restart"] = "SIGKILL of rabbitmq-server, started again on its data"
            counted.append("worker_stopped_on_consumer_timeout")
        lines[start:end] = [f"  {labels[kind]:<56} {log.faults.get(kind, 0):>8}{tried.get(kind, '')}"
                            for kind, _ in CELERY_LABELS
                                            if kind in [*harness.kinds, *counted]]
        return "\n".join(lines)

    return drive(harness, args, render,
                 banner=f"celery chaos on {opts.db} and {args.broker}: {opts.workers} workers x 2 processes, lease "
                        f"{opts.lease} s, {opts.duration:.0f} s of faults, seed {opts.seed}",
                 report={"celery": True, "broker": args.broker})
