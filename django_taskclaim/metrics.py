"""Prometheus metrics (optional: ``pip install django-taskclaim[prometheus]``).

Enable them once per process, e.g. in your own ``AppConfig.ready()``::

    from django_taskclaim import metrics
    metrics.install()                      # counters + database gauges on the default registry

Counters are fed by the signals of :mod:`django_taskclaim.signals`, so they count events of
the process they run in (use prometheus_client's multiprocess mode for forking servers and
Celery prefork pools). The gauges query the task table on every scrape, so register them
in one process only (``install(database_gauges=False)`` elsewhere).

Metrics (labels in brackets):

- ``taskclaim_claims_total{outcome}``: ``claimed``, ``taken_over`` (a lease had expired),
  ``duplicate`` (found the task running or done; not executed)
- ``taskclaim_takeovers_total``: claims that took over an expired lease
- ``taskclaim_duplicate_deliveries_total``: deliveries that found the task running or done
- ``taskclaim_fenced_writes_total{action}``: writes refused because the writer was fenced
  off (``complete``, ``heartbeat``, ``fail``, ``release``, ``check``, ``fenced write``)
- ``taskclaim_finished_total{outcome}``: attempts that ended: ``succeeded``, ``failed``,
  ``retry``, ``released``, ``force_released``
- ``taskclaim_heartbeats_lost_total``: keepalives that lost their claim
- ``taskclaim_reclaimed_total{status}``: expired leases reclaimed, by the new status
- ``taskclaim_tasks{status}`` (gauge, queried per scrape): tasks by status
- ``taskclaim_expired_leases`` (gauge, queried per scrape): running tasks whose lease
  expired by the database clock and whose row no transaction holds: what a reclaim would move
- ``taskclaim_held_leases`` (gauge, queried per scrape): running tasks whose lease expired but
  whose row an open transaction locks (the owner inside ``fenced()``): alive, not reclaimable
- ``taskclaim_queue_depth{queue,state}`` (gauge, queried per scrape): queued tasks by queue,
  ``due`` (pending, runnable now), ``deferred`` (pending, not before a later time), ``running``
- ``taskclaim_queue_oldest_due_seconds{queue}`` (gauge, queried per scrape): how long the oldest
  due task of each queue has waited, by the database clock (0 with none due): what to alert on
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Count
from django.http import HttpRequest, HttpResponse

try:
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        REGISTRY,
        CollectorRegistry,
        Counter,
        generate_latest,
    )
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImproperlyConfigured(
        "django_taskclaim.metrics needs prometheus-client: "
        "pip install 'django-taskclaim[prometheus]'"
    ) from exc

from . import signals
from .models import Task, held_ids
from .status import Outcome

NAMESPACE = "taskclaim"
EXPIRED_HELP = "Running tasks whose lease expired by the database clock and that no transaction holds"
HELD_HELP = "Running tasks whose lease expired but whose row an open transaction locks (held)"
DEPTH_HELP = "Queued tasks by queue: due (pending, runnable now), deferred (pending, later), running"
OLDEST_HELP = "Seconds the oldest due task of each queue has waited, by the database clock"


class DatabaseCollector(Collector):
    """Gauges read from the task table at scrape time: tasks by status, expired and held leases."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def _tasks(self) -> Any:
        manager = Task.objects.db_manager(self.using) if self.using else Task.objects
        return manager.get_queryset()

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Without describe(), registering would run collect(): a query at start-up.
        yield GaugeMetricFamily(f"{NAMESPACE}_tasks", "Tasks by status", labels=["status"])
        yield GaugeMetricFamily(f"{NAMESPACE}_expired_leases", EXPIRED_HELP)
        yield GaugeMetricFamily(f"{NAMESPACE}_held_leases", HELD_HELP)
        yield GaugeMetricFamily(f"{NAMESPACE}_queue_depth", DEPTH_HELP, labels=["queue", "state"])
        yield GaugeMetricFamily(f"{NAMESPACE}_queue_oldest_due_seconds", OLDEST_HELP, labels=["queue"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        tasks = self._tasks()
        counts = dict(tasks.order_by().values_list("status").annotate(n=Count("pk")))
        by_status = GaugeMetricFamily(f"{NAMESPACE}_tasks", "Tasks by status", labels=["status"])
        for status in Task.Status.values:
            by_status.add_metric([status], counts.get(status, 0))
        yield by_status
        expired = list(tasks.expired().values_list("pk", flat=True))
        held = held_ids(tasks.db, expired)
        yield GaugeMetricFamily(f"{NAMESPACE}_expired_leases", EXPIRED_HELP, value=len(expired) - len(held))
        yield GaugeMetricFamily(f"{NAMESPACE}_held_leases", HELD_HELP, value=len(held))
        depth = GaugeMetricFamily(f"{NAMESPACE}_queue_depth", DEPTH_HELP, labels=["queue", "state"])
        oldest = GaugeMetricFamily(f"{NAMESPACE}_queue_oldest_due_seconds", OLDEST_HELP, labels=["queue"])
        for q in tasks.queue_stats():
            for state in ("due", "deferred", "running"):
                depth.add_metric([q["queue"], state], q[state])
            oldest.add_metric([q["queue"]], q["oldest_due_age"] or 0.0)
        yield depth
        yield oldest


class TaskClaimMetrics:
    """The counters, and the signal receivers that feed them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, namespace=NAMESPACE, registry=registry)

        self.claims = counter("claims", "Claims by outcome", ("outcome",))
        self.takeovers = counter("takeovers", "Claims that took over an expired lease")
        self.duplicates = counter("duplicate_deliveries",
                                  "Deliveries that found the task running or done")
        self.fenced_writes = counter("fenced_writes", "Writes refused after being fenced off",
                                     ("action",))
        self.finished = counter("finished", "Attempts that ended, by outcome", ("outcome",))
        self.heartbeats_lost = counter("heartbeats_lost", "Keepalives that lost their claim")
        self.reclaimed = counter("reclaimed", "Expired leases reclaimed, by new status",
                                 ("status",))

    # -- receivers (connected by install()) -----------------------------------------------------
    def on_claimed(self, sender: Any, takeover: bool = False, **kwargs: Any) -> None:
        self.claims.labels(outcome="taken_over" if takeover else "claimed").inc()

    def on_taken_over(self, sender: Any, **kwargs: Any) -> None:
        self.takeovers.inc()

    def on_duplicate(self, sender: Any, **kwargs: Any) -> None:
        self.claims.labels(outcome=Outcome.DUPLICATE.value).inc()
        self.duplicates.inc()

    def on_stale_write(self, sender: Any, action: str = "", **kwargs: Any) -> None:
        self.fenced_writes.labels(action=action).inc()

    def on_completed(self, sender: Any, **kwargs: Any) -> None:
        self.finished.labels(outcome=Outcome.SUCCEEDED.value).inc()

    def on_failed(self, sender: Any, retry: bool = False, **kwargs: Any) -> None:
        self.finished.labels(outcome=(Outcome.RETRY if retry else Outcome.FAILED).value).inc()

    def on_released(self, sender: Any, claim: Any = None, **kwargs: Any) -> None:
        self.finished.labels(outcome=Outcome.RELEASED.value if claim is not None else "force_released").inc()

    def on_heartbeat_lost(self, sender: Any, **kwargs: Any) -> None:
        self.heartbeats_lost.inc()

    def on_reclaimed(self, sender: Any, tasks: Any = (), **kwargs: Any) -> None:
        for row in tasks:
            self.reclaimed.labels(status=row[3]).inc()

    def connections(self) -> list[tuple[Any, Any]]:
        return [
            (signals.task_claimed, self.on_claimed),
            (signals.task_taken_over, self.on_taken_over),
            (signals.duplicate_delivery, self.on_duplicate),
            (signals.stale_write_refused, self.on_stale_write),
            (signals.task_completed, self.on_completed),
            (signals.task_failed, self.on_failed),
            (signals.task_released, self.on_released),
            (signals.heartbeat_lost, self.on_heartbeat_lost),
            (signals.tasks_reclaimed, self.on_reclaimed),
        ]


_installed: dict[int, tuple[TaskClaimMetrics, DatabaseCollector | None]] = {}


def _uid(registry: CollectorRegistry, signal: Any) -> str:
    return f"django_taskclaim.metrics:{id(registry)}:{id(signal)}"


def install(registry: CollectorRegistry | None = None, *, database_gauges: bool = True,
            using: str | None = None) -> TaskClaimMetrics:
    """Register the counters (and the database gauges) and connect them to the signals.

    Idempotent per registry: a second call returns the metrics of the first.
    """
    registry = REGISTRY if registry is None else registry
    if id(registry) in _installed:
        return _installed[id(registry)][0]
    metrics = TaskClaimMetrics(registry)
    collector = None
    if database_gauges:
        collector = DatabaseCollector(using)
        registry.register(collector)
    for signal, receiver in metrics.connections():
        signal.connect(receiver, weak=False, dispatch_uid=_uid(registry, signal))
    _installed[id(registry)] = (metrics, collector)
    return metrics


def uninstall(registry: CollectorRegistry | None = None) -> None:
    """Disconnect the receivers and unregister the metrics that :func:`install` registered."""
    registry = REGISTRY if registry is None else registry
    entry = _installed.pop(id(registry), None)
    if entry is None:
        return
    metrics, collector = entry
    for signal, _receiver in metrics.connections():
        signal.disconnect(dispatch_uid=_uid(registry, signal))
    for counter in (metrics.claims, metrics.takeovers, metrics.duplicates, metrics.fenced_writes,
                    metrics.finished, metrics.heartbeats_lost, metrics.reclaimed):
        registry.unregister(counter)
    if collector is not None:
        registry.unregister(collector)


def metrics_view(request: HttpRequest, registry: CollectorRegistry | None = None) -> HttpResponse:
    """The Prometheus text format for ``registry`` (default: the global one).

    Route it on an internal address only: it reveals task counts and runs a few queries (the
    counts by status, the expired leases, and which of those an open transaction holds).
    """
    output = generate_latest(REGISTRY if registry is None else registry)
    return HttpResponse(output, content_type=CONTENT_TYPE_LATEST)


__all__ = ["DatabaseCollector", "TaskClaimMetrics", "install", "metrics_view", "uninstall"]
