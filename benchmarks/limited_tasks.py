"""Django's no-op task under concurrency limits, ours only (``benchmarks.limits --peers``): tasks of
10 keys, task ``i`` of key ``k{i % 10}``, each key limited to 1,000 (``limited-wide``: never full,
every claim takes the gate path) or to 1 (``limited-tight``: ten tasks at once at most, fewer than
the workers want)."""

from __future__ import annotations

from typing import Any

try:
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from django_tasks import task  # type: ignore[import-not-found,no-redef,unused-ignore]

from django_taskclaim.tasks import claim_options

from .dtdb_tasks import EXECUTED

KEYS = 10


def key_of(i: int) -> str:
    return f"k{i % KEYS}"


@task()
@claim_options(concurrency_key=key_of, concurrency_limit=1000)
def noop_wide(i: int) -> None:
    EXECUTED.append(i)


@task()
@claim_options(concurrency_key=key_of, concurrency_limit=1)
def noop_tight(i: int) -> None:
    EXECUTED.append(i)


KINDS: dict[str, Any] = {"limited-wide": noop_wide, "limited-tight": noop_tight}
