"""Prometheus metrics (optional: ``pip install django-taskclaim[prometheus]``).

Enable them once per process, e.g. in your own ``AppConfig.ready()``::

    from django_taskclaim import metrics
    metrics.install()                      # counters + database gauges on the default registry

Counters are fed by the signals of :mod:`django_taskclaim.signals`, so they count events of
the process they run in (use prometheus_client's multiprocess mode for forking servers and
Celery prefork pools). The gauges query the task table on every scrape, so register them
in one process only (``install(database_gauges=False)`` elsewhere).

Metrics (labels in brackets; every one also has ``database``, the alias of the task database
the event happened in or the gauge was read from: with tenants routed over several databases
by ``TASKCLAIM_ROUTER``, one series per database):

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
- ``taskclaim_schedule_lag_seconds{schedule}`` (gauge, queried per scrape, with the database
  gauges; no ``database`` label: ticks live in the default task database): how long the oldest
  tick of each schedule of ``TASKCLAIM_SCHEDULES`` that is due but has no task has waited (the first
  tick after the newest one enqueued); 0 when none is missing. An enqueued tick waiting for a
  worker shows in ``taskclaim_queue_oldest_due_seconds`` instead
- ``taskclaim_outbox_messages{status}`` (gauge, queried per scrape): outbox messages by status,
  ``pending`` (waiting for a relay, or under delivery), ``delivered``, ``failed``
- ``taskclaim_outbox_oldest_pending_seconds`` (gauge, queried per scrape): how long the oldest
  pending outbox message has waited since it was recorded, by the database clock (0 with none)
- ``taskclaim_database_up`` (gauge, per scrape): 1 when the task database answered, 0 when it
  could not be reached (its other gauges are then missing from the scrape; the others' are there)

The admin dashboard's figures, read per scrape by the same queries (:mod:`django_taskclaim.dashboard`;
``install(window_gauges=False)`` leaves them out), each with ``window`` (``1h``, ``1d``), ``queue``
(``""``: tasks claimed by key) and ``task_path`` besides ``database``: of the attempts started in the
window, by the database clock:

- ``taskclaim_window_started``, ``taskclaim_window_succeeded``, ``taskclaim_window_failed``,
  ``taskclaim_window_takeovers``, ``taskclaim_window_fenced_writes`` (gauges)
- ``taskclaim_window_wait_seconds{quantile}`` and ``taskclaim_window_run_seconds{quantile}``
  (gauges, ``quantile`` ``0.5`` and ``0.95``): from due (enqueued, or its not-before time) to start,
  and run time
- ``taskclaim_limit_waiting{key}`` and ``taskclaim_limit_running{key}`` (gauges): a concurrency
  key's pending and running tasks
- ``taskclaim_schedule_next_tick_timestamp_seconds{schedule}`` (gauge, with the schedules' lag): when
  each schedule fires next, as a Unix time
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
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

from . import dashboard, routing, signals
from .models import OutboxMessage, Task, held_ids
from .status import Outcome

logger = logging.getLogger("django_taskclaim")
NAMESPACE = "taskclaim"
EXPIRED_HELP = "Running tasks whose lease expired by the database clock and that no transaction holds"
HELD_HELP = "Running tasks whose lease expired but whose row an open transaction locks (held)"
DEPTH_HELP = "Queued tasks by queue: due (pending, runnable now), deferred (pending, later), running"
OLDEST_HELP = "Seconds the oldest due task of each queue has waited, by the database clock"
LAG_HELP = "Seconds the oldest due tick of each schedule without a task has waited (0: none missing)"
OUTBOX_HELP = "Outbox messages by status: pending (waiting for a relay or under delivery), delivered, failed"
OUTBOX_OLDEST_HELP = "Seconds the oldest pending outbox message has waited since it was recorded, by the database clock"
NEXT_TICK_HELP = "When each schedule fires next, as a Unix time (seconds)"
UP_HELP = "1 when the task database answered this scrape's queries, 0 when it could not be reached"


class DatabaseCollector(Collector):
    """Gauges read from the task table at scrape time: tasks by status, expired and held leases,
    queue depth; of database ``using``, else of every task database (``TASKCLAIM_DATABASES``)."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Without describe(), registering would run collect(): a query at start-up.
        yield from self._families()

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily(f"{NAMESPACE}_tasks", "Tasks by status", labels=["status", "database"]),
            GaugeMetricFamily(f"{NAMESPACE}_expired_leases", EXPIRED_HELP, labels=["database"]),
            GaugeMetricFamily(f"{NAMESPACE}_held_leases", HELD_HELP, labels=["database"]),
            GaugeMetricFamily(f"{NAMESPACE}_queue_depth", DEPTH_HELP, labels=["queue", "state", "database"]),
            GaugeMetricFamily(f"{NAMESPACE}_queue_oldest_due_seconds", OLDEST_HELP, labels=["queue", "database"]),
            GaugeMetricFamily(f"{NAMESPACE}_database_up", UP_HELP, labels=["database"]),
            GaugeMetricFamily(f"{NAMESPACE}_outbox_messages", OUTBOX_HELP, labels=["status", "database"]),
            GaugeMetricFamily(f"{NAMESPACE}_outbox_oldest_pending_seconds", OUTBOX_OLDEST_HELP, labels=["database"]),
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        by_status, expired_leases, held_leases, depth, oldest, up, outbox, outbox_oldest = families = self._families()
        for alias in routing.databases(self.using):
            try:
                found = self._read(alias)
            except routing.UNREACHABLE as exc:
                # One task database out of reach leaves the others' figures in the scrape; its own
                # series go missing and taskclaim_database_up says why.
                logger.warning("metrics: task database %r cannot be reached: %s", alias, exc)
                connections[alias].close_if_unusable_or_obsolete()  # a new session next scrape
                up.add_metric([alias], 0)
                continue
            up.add_metric([alias], 1)
            counts, expired, held, queues, messages = found
            for status in Task.Status.values:
                by_status.add_metric([status, alias], counts.get(status, 0))
            expired_leases.add_metric([alias], expired - held)
            held_leases.add_metric([alias], held)
            for q in queues:
                for state in ("due", "deferred", "running"):
                    depth.add_metric([q["queue"], state, alias], q[state])
                oldest.add_metric([q["queue"], alias], q["oldest_due_age"] or 0.0)
            for status in OutboxMessage.Status.values:
                outbox.add_metric([status, alias], messages[status])
            outbox_oldest.add_metric([alias], messages["oldest_pending_age"] or 0.0)
        yield from families

    @staticmethod
    def _read(alias: str) -> tuple[dict[str, int], int, int, list[dict[str, Any]], dict[str, Any]]:
        """Of database ``alias``: tasks by status, expired leases, held ones, the queues' figures,
        the outbox's."""
        tasks = Task.objects.db_manager(alias).get_queryset()
        counts = dict(tasks.order_by().values_list("status").annotate(n=Count("pk")))
        expired = list(tasks.expired().values_list("pk", flat=True))
        outbox = OutboxMessage.objects.using(alias).stats()
        return counts, len(expired), len(held_ids(alias, expired)), tasks.queue_stats(), outbox


WINDOW_HELP = {
    "started": "Attempts started in the window (duplicate deliveries aside)",
    "succeeded": "Attempts started in the window that succeeded",
    "failed": "Attempts started in the window that failed (for good, or to be retried)",
    "takeovers": "Attempts started in the window whose expired lease another claim took over",
    "fenced_writes": "Writes refused to attempts started in the window once fenced off",
}
WAIT_HELP = "Seconds from due (enqueued, or its not-before time) to start of the window's attempts, by quantile"
RUN_HELP = "Run time in seconds of the window's attempts that ended, by quantile"
LIMIT_WAITING_HELP = "Pending tasks of each concurrency key"
LIMIT_RUNNING_HELP = "Running tasks of each concurrency key"


class DashboardCollector(Collector):
    """The admin dashboard's figures (:mod:`.dashboard`), read at scrape time by its queries, under
    the names the dashboard documents: per window, queue and task path; the concurrency keys."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families()

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        labels = ["window", "queue", "task_path", "database"]
        counts = tuple(GaugeMetricFamily(f"{NAMESPACE}_window_{name}", WINDOW_HELP[name], labels=labels)
                       for name in dashboard.COUNTS)
        return (*counts,
                GaugeMetricFamily(f"{NAMESPACE}_window_wait_seconds", WAIT_HELP, labels=[*labels, "quantile"]),
                GaugeMetricFamily(f"{NAMESPACE}_window_run_seconds", RUN_HELP, labels=[*labels, "quantile"]),
                GaugeMetricFamily(f"{NAMESPACE}_limit_waiting", LIMIT_WAITING_HELP, labels=["key", "database"]),
                GaugeMetricFamily(f"{NAMESPACE}_limit_running", LIMIT_RUNNING_HELP, labels=["key", "database"]))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = self._families()
        counts, (wait, run, waiting, running) = families[:len(dashboard.COUNTS)], families[len(dashboard.COUNTS):]
        for alias in routing.databases(self.using):
            try:
                windows = [(name, dashboard.group_figures(alias, seconds))
                           for name, (seconds, _step) in dashboard.WINDOWS.items()]
                limits = dashboard.limits_waiting(alias)
            except routing.UNREACHABLE as exc:  # taskclaim_database_up says it: the series go missing
                logger.warning("metrics: task database %r cannot be reached: %s", alias, exc)
                connections[alias].close_if_unusable_or_obsolete()
                continue
            for name, groups in windows:
                for g in groups:
                    labels = [name, g.queue or "", g.task_path, alias]
                    for family, figure in zip(counts, dashboard.COUNTS, strict=True):
                        family.add_metric(labels, getattr(g, figure))
                    for q, seconds in g.wait.items():
                        wait.add_metric([*labels, str(q)], seconds)
                    for q, seconds in g.run.items():
                        run.add_metric([*labels, str(q)], seconds)
            for limit in limits:
                waiting.add_metric([limit["key"], alias], limit["waiting"])
                running.add_metric([limit["key"], alias], limit["running"])
        yield from families


class TaskClaimMetrics:
    """The counters, and the signal receivers that feed them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, (*labels, "database"), namespace=NAMESPACE, registry=registry)

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
    def on_claimed(self, sender: Any, takeover: bool = False, using: str = "", **kwargs: Any) -> None:
        self.claims.labels(outcome="taken_over" if takeover else "claimed", database=using).inc()

    def on_taken_over(self, sender: Any, using: str = "", **kwargs: Any) -> None:
        self.takeovers.labels(database=using).inc()

    def on_duplicate(self, sender: Any, using: str = "", **kwargs: Any) -> None:
        self.claims.labels(outcome=Outcome.DUPLICATE.value, database=using).inc()
        self.duplicates.labels(database=using).inc()

    def on_stale_write(self, sender: Any, action: str = "", using: str = "", **kwargs: Any) -> None:
        self.fenced_writes.labels(action=action, database=using).inc()

    def on_completed(self, sender: Any, using: str = "", **kwargs: Any) -> None:
        self.finished.labels(outcome=Outcome.SUCCEEDED.value, database=using).inc()

    def on_failed(self, sender: Any, retry: bool = False, using: str = "", **kwargs: Any) -> None:
        self.finished.labels(outcome=(Outcome.RETRY if retry else Outcome.FAILED).value, database=using).inc()

    def on_released(self, sender: Any, claim: Any = None, using: str = "", **kwargs: Any) -> None:
        outcome = Outcome.RELEASED.value if claim is not None else "force_released"
        self.finished.labels(outcome=outcome, database=using).inc()

    def on_heartbeat_lost(self, sender: Any, using: str = "", **kwargs: Any) -> None:
        self.heartbeats_lost.labels(database=using).inc()

    def on_reclaimed(self, sender: Any, tasks: Any = (), using: str = "", **kwargs: Any) -> None:
        for row in tasks:
            self.reclaimed.labels(status=row[3], database=using).inc()

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


_installed: dict[int, tuple[TaskClaimMetrics, list[Collector]]] = {}


def _uid(registry: CollectorRegistry, signal: Any) -> str:
    return f"django_taskclaim.metrics:{id(registry)}:{id(signal)}"


class ScheduleCollector(Collector):
    """The lag of each schedule of ``TASKCLAIM_SCHEDULES``, read at scrape time (one indexed lookup
    of its recent tick keys, and the last tick's task, a schedule)."""

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(f"{NAMESPACE}_schedule_lag_seconds", LAG_HELP, labels=["schedule"])
        yield GaugeMetricFamily(f"{NAMESPACE}_schedule_next_tick_timestamp_seconds", NEXT_TICK_HELP,
                                labels=["schedule"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from .schedules import ScheduleError, configured
        from .schedules.status import standing

        lag = GaugeMetricFamily(f"{NAMESPACE}_schedule_lag_seconds", LAG_HELP, labels=["schedule"])
        next_tick = GaugeMetricFamily(f"{NAMESPACE}_schedule_next_tick_timestamp_seconds", NEXT_TICK_HELP,
                                      labels=["schedule"])
        try:
            found = configured()
        except ScheduleError as exc:  # the system check says so too (E301-E305)
            logger.warning("metrics: TASKCLAIM_SCHEDULES cannot be read: %s", exc)
            found = []
        for schedule in found:
            try:
                state = standing(schedule)
            except routing.UNREACHABLE as exc:  # taskclaim_database_up says it: the series goes missing
                logger.warning("metrics: schedule %r cannot be read: %s", schedule.name, exc)
                continue
            lag.add_metric([schedule.name], state.lag)
            if state.next_tick is not None:
                next_tick.add_metric([schedule.name], state.next_tick.timestamp())
        yield lag
        yield next_tick


def install(registry: CollectorRegistry | None = None, *, database_gauges: bool = True,
            using: str | None = None, window_gauges: bool = True) -> TaskClaimMetrics:
    """Register the counters (and the database gauges) and connect them to the signals.

    ``window_gauges``: with the database gauges, the dashboard's figures too (``taskclaim_window_*``,
    ``taskclaim_limit_*``): one GROUP BY query per window and scrape, and one over the limited tasks
    (their cost: docs/operations.md).

    Idempotent per registry: a second call returns the metrics of the first.
    """
    registry = REGISTRY if registry is None else registry
    if id(registry) in _installed:
        return _installed[id(registry)][0]
    metrics = TaskClaimMetrics(registry)
    collectors: list[Collector] = []
    if database_gauges:
        collectors = [DatabaseCollector(using), ScheduleCollector()]
        if window_gauges:
            collectors.append(DashboardCollector(using))
        for collector in collectors:
            registry.register(collector)
    for signal, receiver in metrics.connections():
        signal.connect(receiver, weak=False, dispatch_uid=_uid(registry, signal))
    _installed[id(registry)] = (metrics, collectors)
    return metrics


def uninstall(registry: CollectorRegistry | None = None) -> None:
    """Disconnect the receivers and unregister the metrics that :func:`install` registered."""
    registry = REGISTRY if registry is None else registry
    entry = _installed.pop(id(registry), None)
    if entry is None:
        return
    metrics, collectors = entry
    for signal, _receiver in metrics.connections():
        signal.disconnect(dispatch_uid=_uid(registry, signal))
    for counter in (metrics.claims, metrics.takeovers, metrics.duplicates, metrics.fenced_writes,
                    metrics.finished, metrics.heartbeats_lost, metrics.reclaimed):
        registry.unregister(counter)
    for collector in collectors:
        registry.unregister(collector)


def metrics_view(request: HttpRequest, registry: CollectorRegistry | None = None) -> HttpResponse:
    """The Prometheus text format for ``registry`` (default: the global one).

    Route it on an internal address only: it reveals task counts and runs a few queries (the
    counts by status, the expired leases, and which of those an open transaction holds).
    """
    output = generate_latest(REGISTRY if registry is None else registry)
    return HttpResponse(output, content_type=CONTENT_TYPE_LATEST)


__all__ = ["DashboardCollector", "DatabaseCollector", "TaskClaimMetrics", "install", "metrics_view", "uninstall"]
