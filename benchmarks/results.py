"""What a benchmark run measures (its sizes) and what it found (its results)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

APP_DRAIN = "django-taskclaim"
WORKER_BATCH = 16  # the worker's batch in the drain's second configuration (procrastinate's top concurrency)
WORKER_DRAIN = f"django-taskclaim worker (batch {WORKER_BATCH})"
RAW_DRAIN = "commit limit (the same statements, psycopg)"
RAW_BATCH_DRAIN = f"commit limit, batch {WORKER_BATCH} (the same statements, psycopg)"


@dataclass
class Sizes:
    bykey_workers: tuple[int, ...] = (1, 2, 4, 8)
    bykey_seconds: float = 3.0
    rounds: int = 3
    drain_tasks: int = 5_000
    drain_workers: tuple[int, ...] = (1, 2, 4)
    procrastinate_concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)  # swept: the best is its figure
    # django-tasks-db's db_worker options that change what it asks the database: swept likewise.
    dtdb_queues: tuple[str, ...] = ("one", "all")
    table_rows: tuple[int, ...] = (10_000, 1_000_000, 10_000_000)
    latency_samples: int = 2_000
    size_queues: int = 8  # the table-size phase's tasks spread over this many queues
    racers: int = 32
    race_keys: int = 500
    audit_workers: int = 4
    audit_seconds: float = 3.0
    peers: bool = True
    # The Django Tasks phase: W worker processes drain this many tasks enqueued through the Tasks
    # API, and this many are enqueued in one transaction (benchmarks/tasks_phase.py).
    tasks_workers: int = 4
    tasks_drain: int = 5_000
    tasks_bulk: int = 10_000
    #: The latency phase: tasks enqueued one at a time to an idle worker, per system.
    idle_samples: int = 200
    # The outbox phase (benchmarks/outbox_phase.py): a drain of this many tasks with and without a
    # message each, by this many workers, then as many relays delivering the messages.
    outbox_tasks: int = 3_000
    outbox_workers: int = 4
    outbox_relay_batch: int = 10
    # The I/O-bound phase (benchmarks/iodrain_phase.py): this many tasks that each wait io_wait
    # seconds, drained by io_workers processes of io_concurrency tasks in flight each; then one
    # worker process holding io_inflight tasks at once, its memory and its statements over
    # io_window seconds with a lease of io_lease seconds (a heartbeat every third of it).
    io_tasks: int = 5_000
    io_wait: float = 0.05
    io_workers: int = 2
    io_concurrency: int = 32
    io_inflight: int = 500
    io_lease: float = 6.0
    io_window: float = 12.0


SMOKE = Sizes(bykey_workers=(1, 2), bykey_seconds=0.3, rounds=1, drain_tasks=300, drain_workers=(1, 2),
              table_rows=(1_000, 10_000), latency_samples=50, racers=4, race_keys=20,
              audit_workers=2, audit_seconds=0.3, peers=False, tasks_workers=2, tasks_drain=100, tasks_bulk=200,
              idle_samples=20, outbox_tasks=100, outbox_workers=2, io_tasks=200, io_inflight=50, io_lease=1.5,
              io_window=2.0)


@dataclass
class TasksResults:
    """What the Django Tasks phase found; a configuration is known by its label."""

    workers: int = 0
    drain_tasks: int = 0
    bulk_tasks: int = 0
    #: configuration label -> system key (benchmarks.tasks_systems), in the order measured
    system_of: dict[str, str] = field(default_factory=dict)
    #: drain configuration label -> tasks/s of each round, rounds in order
    drain_runs: dict[str, list[float]] = field(default_factory=dict)
    #: drain configuration label -> executions beyond one per task, over all rounds
    duplicates: dict[str, int] = field(default_factory=dict)
    #: bulk configuration label -> seconds of each round for bulk_tasks enqueues in one transaction
    bulk_runs: dict[str, list[float]] = field(default_factory=dict)
    #: system key -> why it was not measured
    skipped: dict[str, str] = field(default_factory=dict)
    #: system key -> its interpreter's and packages' versions
    versions: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass
class IoResults:
    """What the I/O-bound phase found; a drain configuration is known by its label."""

    tasks: int = 0
    wait: float = 0.0
    workers: int = 0
    concurrency: int = 0
    #: configuration label -> system key (benchmarks.tasks_systems), in the order measured
    system_of: dict[str, str] = field(default_factory=dict)
    #: configuration label -> the kind of task it drains (benchmarks.io_tasks.KINDS)
    kind_of: dict[str, str] = field(default_factory=dict)
    #: configuration label -> tasks/s of each round, rounds in order
    drain_runs: dict[str, list[float]] = field(default_factory=dict)
    #: configuration label -> executions beyond one per task, over all rounds
    duplicates: dict[str, int] = field(default_factory=dict)
    #: system key -> why it was not measured
    skipped: dict[str, str] = field(default_factory=dict)
    #: system key -> its interpreter's and packages' versions
    versions: dict[str, dict[str, str]] = field(default_factory=dict)
    inflight: int = 0
    lease: float = 0.0
    window: float = 0.0
    #: system key -> {"idle_kib", "loaded_kib", "per_task_kib"}: the worker's RSS without and with
    #: ``inflight`` tasks in flight
    memory: dict[str, dict[str, float]] = field(default_factory=dict)
    #: system key -> {statement (normalised text): calls per second} over the window, for the
    #: statements that touch the system's task table
    statements: dict[str, dict[str, float]] = field(default_factory=dict)
    #: system key -> why its tasks in flight were not measured
    inflight_skipped: dict[str, str] = field(default_factory=dict)
    #: why statements were not counted (pg_stat_statements unavailable), or ""
    statements_skipped: str = ""


@dataclass
class Results:
    env: dict[str, str] = field(default_factory=dict)
    bykey: dict[str, dict[int, float]] = field(
        default_factory=lambda: {"app": {}, "app_noaudit": {}, "raw": {}, "minimal": {}})
    bykey_runs: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    drain: dict[str, dict[int, float]] = field(default_factory=dict)
    drain_runs: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    duplicates: dict[str, dict[int, int]] = field(default_factory=dict)
    sizes: dict[int, dict[str, float]] = field(default_factory=dict)
    fill_seconds: dict[int, float] = field(default_factory=dict)
    race: dict[str, float] = field(default_factory=dict)
    #: Every round of the contention phase: label -> [(p50, p99), ...], rounds in order.
    race_runs: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    #: Every round of the table-size phase: rows -> [{"bykey_p50": ..., ...}, ...], rounds in order.
    size_runs: dict[int, list[dict[str, float]]] = field(default_factory=dict)
    #: How many queues the table-size phase's tasks were spread over.
    size_queues: int = 0
    audit: dict[str, float] = field(default_factory=dict)
    #: The latency phase (benchmarks.latency): latencies, skipped, versions.
    idle: dict[str, Any] = field(default_factory=dict)
    tasks: TasksResults = field(default_factory=TasksResults)
    #: The outbox phase: drain_plain, drain_outbox (tasks/s), relay (messages/s), sent_twice, its sizes.
    outbox: dict[str, Any] = field(default_factory=dict)
    iodrain: IoResults = field(default_factory=IoResults)
    #: The durable steps phase (benchmarks/steps_phase.py): its rounds and the steps per task.
    steps: dict[str, Any] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
