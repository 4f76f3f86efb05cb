"""What the Task admin adds for queued work and Django tasks: the task path (column, filter,
search), a search by task id, the queue overview and schedules pages, and cancel and retry buttons on a
task's page. A mixin of ``TaskAdmin`` (admin.py), kept apart from the list's state columns.

The buttons call the same guarded queryset actions as the list's actions (``cancel()``,
``reset()``), so a running owner is fenced off as by any operator action; each needs its model
permission and a POST.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST

from . import routing
from .conf import settings
from .ids import parse_task_id, task_id
from .models import Task
from .status import RESETTABLE, RESULT_STATUS, UNFINISHED

#: The list's task path filter offers at most this many paths (alphabetically)...
PATH_CHOICES = 100
#: ...of those of the most recent tasks: a bounded read (the primary key's index, backwards) on
#: every page view, where a DISTINCT over the whole table would read all of it.
PATHS_FROM_RECENT = 5000


class TaskPathFilter(admin.SimpleListFilter):
    """Queued tasks by the path of what runs them (a Django task's module path). Any path can be
    filtered on (``?task_path=...``) or searched for; the choices come from the recent tasks."""

    title = _("task path")
    parameter_name = "task_path"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recent = (model_admin.get_queryset(request).order_by("-pk")
                  .values_list("task_path", flat=True)[:PATHS_FROM_RECENT])
        return [(p, p) for p in sorted({path for path in recent if path})[:PATH_CHOICES]]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        return queryset.filter(task_path=self.value()) if self.value() else queryset


def queue_overview(aliases: tuple[str, ...]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Each queue's depth (due, deferred), running tasks and oldest waiting due task, per task
    database (``TaskQuerySet.queue_stats``); and the databases that could not be read, with why.
    A database out of reach is named on the page, the others still shown."""
    rows: list[dict[str, Any]] = []
    unreachable: dict[str, str] = {}
    for alias in aliases:
        try:
            stats = Task.objects.db_manager(alias).queue_stats()
        except routing.UNREACHABLE as exc:
            unreachable[alias] = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            continue
        rows += [{**q, "database": alias} for q in stats]
    return rows, unreachable


def schedule_overview() -> tuple[list[dict[str, Any]], str]:
    """Each schedule's standing (``schedules.status``) with a link to its last tick's task; and why
    the setting cannot be read, if it cannot (the page says so rather than failing)."""
    from .schedules import ScheduleError, configured
    from .schedules.status import standing

    try:
        found = configured()
    except ScheduleError as exc:
        return [], str(exc)
    rows = []
    for schedule in found:
        state = standing(schedule)
        task = state.last_task
        rows.append({
            "name": schedule.name, "when": schedule.cron or f"every {schedule.every} s",
            "timezone": schedule.timezone, "runs": schedule.task or f"queue {schedule.queue}",
            "catch_up": schedule.catch_up, "last_tick": state.last_tick, "next_tick": state.next_tick,
            "lag": state.lag, "task": task,
            "task_url": None if task is None else reverse(
                f"admin:{Task._meta.app_label}_{Task._meta.model_name}_change", args=[task.pk]),
        })
    return rows, ""


class QueuedWorkAdminMixin:
    """The task path, the queue overview and the per-task cancel and retry buttons."""

    # The templates at admin/django_taskclaim/task/ add the queue link and the buttons: the
    # admin looks for them there by the model's name, so nothing names them here.

    # -- columns and fields -------------------------------------------------------------------
    @admin.display(description=_("task path"), ordering="task_path")
    def task_path_display(self, obj: Task) -> str:
        if obj.task_path:
            return obj.task_path
        return "-" if obj.queue is None else str(_("(a handler)"))

    @admin.display(description=_("task id"))
    def task_id_display(self, obj: Task) -> str:
        """The id the Django task's result, ``taskclaim_inspect --id`` and the logs use."""
        return task_id(obj._state.db or settings.DATABASE, obj.pk)

    @admin.display(description=_("Django Tasks status"))
    def result_status_display(self, obj: Task) -> str:
        """The status Django's Tasks framework reports, by the one mapping (``status.RESULT_STATUS``)."""
        word = RESULT_STATUS[obj.status]
        return word if word.lower() == obj.status else f"{word} ({obj.status})"

    # -- search: a task id too ---------------------------------------------------------------
    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        found, duplicates = super().get_search_results(request, queryset, search_term)  # type: ignore[misc]
        term = search_term.strip()
        if term:
            try:
                alias, pk = parse_task_id(term, using=queryset.db)
            except ValueError:
                return found, duplicates
            if alias == queryset.db:
                found = found | queryset.filter(pk=pk)
        return found, duplicates

    # -- pages -------------------------------------------------------------------------------
    def get_urls(self) -> list[Any]:
        site: admin.AdminSite = self.admin_site  # type: ignore[attr-defined]
        info = Task._meta.app_label, Task._meta.model_name
        own = [
            path("queues/", site.admin_view(self.queues_view), name="{}_{}_queues".format(*info)),
            path("schedules/", site.admin_view(self.schedules_view), name="{}_{}_schedules".format(*info)),
            # DESIGN §14 names it admin:django_taskclaim_dashboard (the app's, not the model's).
            path("dashboard/", site.admin_view(self.dashboard_view), name=f"{info[0]}_dashboard"),
            path("<int:pk>/cancel/", site.admin_view(require_POST(self.cancel_view)),
                 name="{}_{}_cancel".format(*info)),
            path("<int:pk>/retry/", site.admin_view(require_POST(self.retry_view)),
                 name="{}_{}_retry".format(*info)),
        ]
        return own + super().get_urls()  # type: ignore[misc]

    def queues_view(self, request: HttpRequest) -> HttpResponse:
        """Each queue of each task database: due, deferred, running, the oldest waiting."""
        if not self.has_view_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        rows, unreachable = queue_overview(routing.databases())
        context = {
            **self.admin_site.each_context(request),  # type: ignore[attr-defined]
            "title": _("Queues"), "opts": Task._meta, "queues": rows, "unreachable": unreachable,
            "several": routing.several(),
        }
        return TemplateResponse(request, "admin/django_taskclaim/task/queues.html", context)

    def schedules_view(self, request: HttpRequest) -> HttpResponse:
        """Each schedule of ``TASKCLAIM_SCHEDULES``: when it fires, its last tick and that tick's task
        (linked), its next tick and its lag. Read-only: the schedules live in the settings."""
        if not self.has_view_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        rows, problem = schedule_overview()
        context = {
            **self.admin_site.each_context(request),  # type: ignore[attr-defined]
            "title": _("Schedules"), "opts": Task._meta, "schedules": rows, "problem": problem,
        }
        return TemplateResponse(request, "admin/django_taskclaim/task/schedules.html", context)

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """The last hour's (``?window=1d``: day's) work per queue and task path, as charts and a table
        (``dashboard``), the running tasks with their progress, the concurrency limits' waiting
        tasks and the schedules' next ticks. Staff with the task's view permission."""
        if not self.has_view_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        from . import charts, dashboard

        name = request.GET.get("window", "1h")
        if name not in dashboard.WINDOWS:
            name = "1h"
        figures = dashboard.window(name)
        running: list[dict[str, Any]] = []
        limits: list[dict[str, Any]] = []
        for alias in routing.databases():
            if alias in figures.unreachable:
                continue
            for task in dashboard.running(alias):
                remaining = task.lease_remaining(now=getattr(task, "db_now", None))
                running.append({"task": task, "database": alias, "lease_left": remaining,
                                "progress": dashboard.progress_text(task),
                                "url": self._url("change", task.pk) + self._database_query(task)})
            limits += dashboard.limits_waiting(alias)
        schedules, problem = schedule_overview()
        context = {
            **self.admin_site.each_context(request),  # type: ignore[attr-defined]
            "title": _("Dashboard"), "opts": Task._meta, "window": figures, "windows": list(dashboard.WINDOWS),
            "over_time": charts.over_time(figures.series, figures.step),
            "per_group": charts.per_group(figures.groups),
            "wait_chart": charts.quantiles(figures.groups, "wait"),
            "run_chart": charts.quantiles(figures.groups, "run"),
            "totals": {n: figures.total(n) for n in dashboard.COUNTS},
            "groups": [{"group": g, "url": self._list_of(g)} for g in figures.groups],
            "running": running, "running_shown": dashboard.RUNNING_SHOWN, "limits": limits,
            "schedules": schedules, "schedules_problem": problem, "unreachable": figures.unreachable,
            "several": routing.several(),
        }
        return TemplateResponse(request, "admin/django_taskclaim/task/dashboard.html", context)

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], add: bool = False,
                           change: bool = False, form_url: str = "", obj: Any = None) -> HttpResponse:
        # The task the page shows, as the change view read it: the buttons that apply to it.
        context["taskclaim_buttons"] = self._buttons(request, obj) if obj is not None else []
        return super().render_change_form(request, context, add, change, form_url, obj)  # type: ignore[misc]

    def _buttons(self, request: HttpRequest, task: Task) -> list[dict[str, str]]:
        """The buttons that apply to ``task`` now and that the user may press."""
        query = self._database_query(task)
        buttons = []
        if task.status in UNFINISHED and self.has_cancel_permission(request):  # type: ignore[attr-defined]
            buttons.append({"label": str(_("Cancel")), "url": self._url("cancel", task.pk) + query})
        if task.status in RESETTABLE and self.has_reset_permission(request):  # type: ignore[attr-defined]
            buttons.append({"label": str(_("Retry")), "url": self._url("retry", task.pk) + query})
        return buttons

    def cancel_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """Cancel one unfinished task (a running owner is fenced off)."""
        if not self.has_cancel_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        return self._operate(request, pk, "cancel", UNFINISHED, _("Cancelled task %(id)s."),
                             _("Task %(id)s is %(status)s: only a pending or running task can be cancelled."))

    def retry_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """Reset one failed or cancelled task to pending, its attempts counted afresh."""
        if not self.has_reset_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        return self._operate(request, pk, "reset", RESETTABLE,
                             _("Task %(id)s is pending again, its attempts counted afresh."),
                             _("Task %(id)s is %(status)s: only a failed or cancelled task can be retried."))

    def _operate(self, request: HttpRequest, pk: int, action: str, applies_to: tuple[str, ...],
                 done_message: Any, refused_message: Any) -> HttpResponse:
        queryset = self.get_queryset(request)  # type: ignore[attr-defined]  # on the page's database
        task = queryset.filter(pk=pk).first()
        if task is None:
            return self._to_task(request, pk, queryset.db)  # the admin's own "does not exist" page
        done = getattr(queryset.filter(pk=pk, status__in=applies_to), action)()
        task.refresh_from_db(using=queryset.db)
        named = {"id": task_id(queryset.db, pk), "status": task.get_status_display().lower()}
        self._log(request, f"{action} (task page)", 1, done)  # type: ignore[attr-defined]  # as the list's actions log
        if done:
            self.message_user(request, done_message % named, messages.SUCCESS)  # type: ignore[attr-defined]
        else:
            self.message_user(request, refused_message % named, messages.WARNING)  # type: ignore[attr-defined]
        return self._to_task(request, pk, queryset.db)

    # -- urls --------------------------------------------------------------------------------
    @staticmethod
    def _url(action: str, pk: int) -> str:
        return reverse(f"admin:{Task._meta.app_label}_{Task._meta.model_name}_{action}", args=[pk])

    def _list_of(self, group: Any) -> str:
        """The task list of one dashboard group: its queue (or tasks claimed by key), its path."""
        query: dict[str, str] = {"queue__isnull": "True"} if group.queue is None else {"queue__exact": group.queue}
        if group.task_path:
            query["task_path"] = group.task_path
        if routing.several():
            query["database"] = group.database
        return reverse(f"admin:{Task._meta.app_label}_{Task._meta.model_name}_changelist") + "?" + urlencode(query)

    @staticmethod
    def _database_query(task: Task) -> str:
        """``?database=alias`` for a task of a database other than the default one."""
        alias = task._state.db
        return "?" + urlencode({"database": alias}) if routing.several() and alias else ""

    def _to_task(self, request: HttpRequest, pk: int, using: str) -> HttpResponse:
        url = self._url("change", pk)
        query = "?" + urlencode({"database": using}) if routing.several() else ""
        return HttpResponseRedirect(url + query)


__all__ = ["PATHS_FROM_RECENT", "PATH_CHOICES", "QueuedWorkAdminMixin", "TaskPathFilter", "queue_overview",
           "schedule_overview"]
