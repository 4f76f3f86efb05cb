"""What a benchmark run measures (its sizes) and what it found (its results)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    racers: int = 32
    race_keys: int = 500
    audit_workers: int = 4
    audit_seconds: float = 3.0
    peers: bool = True


SMOKE = Sizes(bykey_workers=(1, 2), bykey_seconds=0.3, rounds=1, drain_tasks=300, drain_workers=(1, 2),
              table_rows=(1_000, 10_000), latency_samples=50, racers=4, race_keys=20,
              audit_workers=2, audit_seconds=0.3, peers=False)


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
    audit: dict[str, float] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
