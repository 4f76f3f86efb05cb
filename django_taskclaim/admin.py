"""The operator's view of the task table: state at a glance, and actions that keep fencing intact.

Every field is read-only: a task's state only moves through the manager (the same guarded
statements the workers use), never through a saved form. Each action needs its own model
permission (``reclaim_task``, ``release_task``, ``reset_task``, ``cancel_task``), so a staff
user with only the view permission sees everything and can change nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest, HttpResponse, QueryDict
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from . import contrib, outages, routing
from .admin_views import QueuedWorkAdminMixin, TaskPathFilter
from .conf import settings
from .dashboard import progress_text
from .lifecycle.api import reclaim_expired_rows
from .models import HELD_REASON, Attempt, OutboxMessage, Step, Task, TaskQuerySet, held_ids
from .readonly_admin import ReadOnlyAdmin
from .store import DbNow, get_store

logger = logging.getLogger("django_taskclaim")
PREVIEW_LENGTH = 80


def human_seconds(seconds: float) -> str:
    """``95`` -> ``"1m 35s"``: short enough for a list column, exact to the second."""
    total = int(abs(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    shown = [f"{n}{unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0s"


def preview(value: Any, length: int = PREVIEW_LENGTH) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= length else text[: length - 1] + "…"


def as_json(value: Any) -> str:
    """A JSON value as the task page shows it: JSON text, not Python's repr."""
    encoder = Task._meta.get_field("result").encoder
    try:
        return json.dumps(value, ensure_ascii=False, cls=encoder)
    except (TypeError, ValueError):
        return str(value)


#: Below this many rows (by the planner's estimate) the list counts them exactly.
ESTIMATE_ABOVE = 10_000


def estimated_rows(using: str, table: str) -> int:
    """The database's own estimate of a table's rows without counting them (its store's
    ``estimated_rows``: PostgreSQL's planner statistics); -1 where it keeps none."""
    with connections[using].cursor() as cursor:
        found = get_store(using).estimated_rows(cursor, table)
    return -1 if found is None else found


class EstimatedCountPaginator(Paginator):
    """Counts an unfiltered list of a large table from the database's statistics (PostgreSQL's).

    ``COUNT(*)`` reads the whole table (or a whole index) on every page view; the estimate is
    one catalogue lookup, and the admin only needs it for the page links. A filtered or
    searched list, a table below ``ESTIMATE_ABOVE`` rows, and a database that keeps no estimate
    get the exact count.
    """

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if isinstance(qs, QuerySet) and not qs.query.where:
            estimate = estimated_rows(qs.db, qs.model._meta.db_table)
            if estimate >= ESTIMATE_ABOVE:
                return estimate
        return int(super().count)


def takeover_exists() -> Exists:
    takeovers = Attempt.objects.filter(task_id=OuterRef("pk"), outcome=Attempt.Outcome.TAKEN_OVER)
    return Exists(takeovers)


class LeaseExpiredFilter(admin.SimpleListFilter):
    """Running tasks by lease state, judged by the database clock (as the claims are): expired
    and free to reclaim, expired but held by an open transaction, or live."""

    title = _("lease")
    parameter_name = "lease"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("expired", _("Expired (database clock)")),
                ("held", _("Held (expired, row locked by an open transaction)")), ("live", _("Live"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() == "expired":
            return cast(TaskQuerySet, queryset).reclaimable()
        if self.value() == "held":
            return cast(TaskQuerySet, queryset).held()
        if self.value() == "live":
            return cast(TaskQuerySet, queryset).live()
        return queryset


def mark_held(tasks: Iterable[Task], using: str) -> None:
    """Set ``held`` on each task: whether its lease expired (by ``db_now``) and an open
    transaction locks its row now. One probe for all of them (a page of the list)."""
    tasks = list(tasks)
    expired = [t.pk for t in tasks if (left := t.lease_remaining(now=getattr(t, "db_now", None))) is not None
               and left < 0]
    held = held_ids(using, expired)
    for task in tasks:
        task.held = task.pk in held  # type: ignore[attr-defined]


#: The request parameter naming the task database a page shows (tenants over several databases).
DATABASE_PARAM = "database"


def database_of(request: HttpRequest) -> str:
    """The task database a request is about: its ``database`` parameter, or the one the list it
    came from was filtered on (the admin's preserved filters); else ``TASKCLAIM_DATABASE``."""
    alias = request.GET.get(DATABASE_PARAM)
    if alias is None and "_changelist_filters" in request.GET:
        alias = QueryDict(request.GET["_changelist_filters"]).get(DATABASE_PARAM)
    return alias if alias in settings.DATABASES else settings.DATABASE


class TaskDatabaseFilter(admin.SimpleListFilter):
    """Which task database the list shows, with tenants routed over several (``TASKCLAIM_ROUTER``):
    ids, counts and actions are per database. Shown only when there are several."""

    title = _("task database")
    parameter_name = DATABASE_PARAM

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        aliases = settings.DATABASES
        return [(alias, alias) for alias in aliases] if len(aliases) > 1 else []

    def choices(self, changelist: Any) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        # No "All": one page cannot list the rows of several databases.
        current = self.value() or settings.DATABASE
        for alias, title in self.lookup_choices:
            yield {"selected": current == alias, "display": title,
                   "query_string": changelist.get_query_string({self.parameter_name: alias})}

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() is not None and self.value() not in settings.DATABASES:
            raise IncorrectLookupParameters(f"{self.value()!r} is not a task database")
        return queryset  # get_queryset() is on the database already (database_of)


class TakeoverFilter(admin.SimpleListFilter):
    """Tasks that some worker took over after another one's lease expired."""

    title = _("has takeovers")
    parameter_name = "takeovers"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        # The expression goes straight into WHERE (not an annotation), so the actions'
        # UPDATE statements on a filtered selection stay valid.
        if self.value() == "yes":
            return queryset.filter(takeover_exists())
        if self.value() == "no":
            return queryset.filter(~takeover_exists())
        return queryset


class TaskPartInline(admin.TabularInline):
    """A part of a task's record shown on its page, read-only (its attempts, its steps): whoever may
    view the task sees it, nothing changes it through a form, and it is read from the database the
    request names (``database_of``), beside its task."""

    extra = 0
    can_delete = False
    show_change_link = False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.view_task") or bool(
            request.user.has_perm(f"{self.opts.app_label}.view_{self.opts.model_name}"))

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(database_of(request))


class AttemptInline(TaskPartInline):
    model = Attempt
    ordering = ("started_at", "id")
    fields = ("token", "owner", "delivery", "started_at", "ended_at", "duration", "outcome",
              "stale_writes", "failure")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = super().get_queryset(request).annotate(db_now=DbNow())
        for link in contrib.delivery_links():  # what an integration links a delivery id to
            qs = link.annotate(qs)
        return qs

    @admin.display(description=_("delivery id"))
    def delivery(self, obj: Attempt) -> str:
        if not obj.delivery_id:
            return "-"
        for link in contrib.delivery_links():
            if (url := link.url(obj)) is not None:
                return format_html('<a href="{}">{}</a>', url, obj.delivery_id)
        return obj.delivery_id

    @admin.display(description=_("failure"))
    def failure(self, obj: Attempt) -> str:
        """The attempt's error, its traceback folded under it."""
        if not obj.error and not obj.traceback:
            return "-"
        if not obj.traceback:
            return obj.error
        return format_html("<details><summary>{}</summary><pre>{}</pre></details>",
                           obj.error or obj.error_class, obj.traceback)

    @admin.display(description=_("duration"))
    def duration(self, obj: Attempt) -> str:
        end = obj.ended_at or getattr(obj, "db_now", None)
        if obj.started_at is None or end is None:
            return "-"
        text = human_seconds((end - obj.started_at).total_seconds())
        return text if obj.ended_at else f"{text} (open)"


class StepInline(TaskPartInline):
    """A task's durable steps (``claim.step``), read-only: the result each stored, and which claim
    (token) stored it, in the order they were stored."""

    model = Step
    ordering = ("id",)
    fields = ("name", "token", "created_at", "result_display")
    readonly_fields = fields
    verbose_name_plural = _("steps (stored results)")

    @admin.display(description=_("result"))
    def result_display(self, obj: Step) -> str:
        text = json.dumps(obj.result, ensure_ascii=False)
        if len(text) <= 200:
            return text
        return format_html("<details><summary>{}…</summary><pre>{}</pre></details>", text[:200], text)


@admin.register(Task)
class TaskAdmin(QueuedWorkAdminMixin, ReadOnlyAdmin):
    list_display = ("key", "tenant", "status_badge", "queue", "task_path_display", "priority", "owner",
                    "fencing_token", "attempts_display", "lease", "progress_display", "took_over", "result_display",
                    "error_display", "updated_at")
    list_display_links = ("key",)
    list_filter = (TaskDatabaseFilter, "status", LeaseExpiredFilter, TakeoverFilter, "queue", TaskPathFilter,
                   "tenant")
    search_fields = ("key", "owner", "task_path")
    ordering = ("-id",)
    list_per_page = 50
    # The exact total is one more COUNT over a possibly large table; the filtered count is
    # shown, and on PostgreSQL an unfiltered list of a large table is counted from statistics.
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    inlines = (AttemptInline, StepInline)
    actions = ("reclaim_expired", "release", "reset", "cancel")
    fieldsets = (
        (None, {"fields": ("tenant", "key", "status", "owner", "fencing_token", "attempts",
                           "max_attempts", "lease", "progress_display")}),
        (_("Result"), {"fields": ("result", "result_ref", "error")}),
        (_("Input"), {"fields": ("payload", "payload_fingerprint", "dispatch")}),
        (_("Queue"), {"fields": ("queue", "priority", "run_after", "task_path", "task_id_display",
                                 "result_status_display")}),
        (_("Times"), {"fields": ("created_at", "updated_at", "lease_expires_at")}),
    )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in self.model._meta.fields] + ["lease", "progress_display", "task_id_display",
                                                            "result_status_display"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # The database clock and the takeover flag come with the page's one query, on the task
        # database the request names: the list, a task's page and the actions on a selection.
        qs = super().get_queryset(request).using(database_of(request))
        return qs.annotate(db_now=DbNow(), has_takeover=takeover_exists())

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        changelist = super().get_changelist_instance(request)
        # Evaluated here (the template reuses the same instances): which expired rows are held.
        mark_held(changelist.result_list, changelist.result_list.db)
        return changelist

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return self._unless_unreachable(request, lambda: super(TaskAdmin, self).changelist_view(request, extra_context))

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return self._unless_unreachable(
            request, lambda: super(TaskAdmin, self).change_view(request, object_id, form_url, extra_context))

    def _unless_unreachable(self, request: HttpRequest, view: Callable[[], HttpResponse]) -> HttpResponse:
        """The page, or, when its task database (one of several) cannot be reached, a page that names
        it (503), not a 500."""
        alias = database_of(request)
        try:
            response = view()
            if isinstance(response, TemplateResponse):
                response.render()  # the page's queries run here, where a database down is caught
            return response
        except routing.UNREACHABLE as exc:
            if not routing.cannot_reach(alias):
                raise
            url = reverse(f"{self.admin_site.name}:django_taskclaim_task_changelist")
            others = format_html_join(", ", '<a href="{}?{}">{}</a>', (
                (url, urlencode({DATABASE_PARAM: other}), other) for other in settings.DATABASES if other != alias))
            content = format_html("<p>{}</p>{}", outages.describe(alias, exc),
                                  format_html("<p>{} {}</p>", _("The other task databases:"), others) if others else "")
            context = {**self.admin_site.each_context(request), "title": _("Task database unavailable"),
                       "content": content}
            return TemplateResponse(request, "admin/base_site.html", context, status=503)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        task = super().get_object(request, object_id, from_field)
        if task is not None:
            mark_held([task], task._state.db)
        return task

    # -- permissions: read-only state (ReadOnlyAdmin), one permission per action -------------
    def _has_task_perm(self, request: HttpRequest, codename: str) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def has_reclaim_permission(self, request: HttpRequest) -> bool:
        return self._has_task_perm(request, "reclaim_task")

    def has_release_permission(self, request: HttpRequest) -> bool:
        return self._has_task_perm(request, "release_task")

    def has_reset_permission(self, request: HttpRequest) -> bool:
        return self._has_task_perm(request, "reset_task")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self._has_task_perm(request, "cancel_task")

    # -- columns ------------------------------------------------------------------------------
    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: Task) -> str:
        return str(obj.get_status_display())

    @admin.display(description=_("attempts"), ordering="attempts")
    def attempts_display(self, obj: Task) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description=_("lease"), ordering="lease_expires_at")
    def lease(self, obj: Task) -> str:
        remaining = obj.lease_remaining(now=getattr(obj, "db_now", None))
        if remaining is None:
            return "-"
        if remaining >= 0:
            return str(_("%(time)s left") % {"time": human_seconds(remaining)})
        if getattr(obj, "held", False):
            return str(_("held: expired %(time)s ago, but %(why)s")
                       % {"time": human_seconds(remaining), "why": HELD_REASON})
        return str(_("expired %(time)s ago") % {"time": human_seconds(remaining)})

    @admin.display(description=_("progress"), ordering="progress")
    def progress_display(self, obj: Task) -> str:
        """The latest ``claim.progress()``, with the token that wrote it (an earlier attempt's, marked)."""
        return progress_text(obj)

    @admin.display(description=_("taken over"), boolean=True)
    def took_over(self, obj: Task) -> bool:
        return bool(getattr(obj, "has_takeover", False))

    @admin.display(description=_("result"))
    def result_display(self, obj: Task) -> str:
        if obj.result_ref:
            return preview(obj.result_ref)
        return "-" if obj.result is None else preview(as_json(obj.result))

    @admin.display(description=_("error"))
    def error_display(self, obj: Task) -> str:
        return preview(obj.error) or "-"

    # -- actions: the manager's guarded code, never a raw status update -----------------------
    def _log(self, request: HttpRequest, action: str, selected: int, done: int) -> None:
        logger.info("operator action %s: %d of %d selected task(s)", action, done, selected,
                    extra={"user": request.user.get_username(), "action": action,
                           "selected": selected, "count": done})

    def _skipped(self, request: HttpRequest, skipped: int, why: str) -> None:
        if skipped > 0:
            self.message_user(request, ngettext(
                "%(count)d selected task was skipped: %(why)s.",
                "%(count)d selected tasks were skipped: %(why)s.", skipped,
            ) % {"count": skipped, "why": why}, messages.WARNING)

    @admin.action(description=_("Reclaim every expired lease (all tasks, by the database clock)"),
                  permissions=["reclaim"])
    def reclaim_expired(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        rows = reclaim_expired_rows(using=queryset.db)
        pending = sum(1 for row in rows if row.status == Task.Status.PENDING)
        self._log(request, "reclaim_expired", queryset.count(), len(rows))
        self.message_user(request, ngettext(
            "Reclaimed %(count)d expired task: %(pending)d back to pending, %(failed)d failed "
            "(no attempts left).",
            "Reclaimed %(count)d expired tasks: %(pending)d back to pending, %(failed)d failed "
            "(no attempts left).", len(rows),
        ) % {"count": len(rows), "pending": pending, "failed": len(rows) - pending},
            messages.SUCCESS)
        held = Task.objects.db_manager(queryset.db).get_queryset().held().count()
        if held:
            self.message_user(request, ngettext(
                "%(count)d held task was skipped: its lease expired, but %(why)s.",
                "%(count)d held tasks were skipped: their lease expired, but %(why)s.", held,
            ) % {"count": held, "why": HELD_REASON}, messages.WARNING)

    def _act(self, request: HttpRequest, queryset: QuerySet[Any], action: str, change: Callable[[], int],
             done_message: Callable[[int], str], why_skipped: str) -> None:
        """Run the queryset's guarded ``change``, log it as ``action``, and tell the operator how many
        it changed and how many of the selection it skipped (and why)."""
        selected = queryset.count()
        done = change()
        self._log(request, action, selected, done)
        self.message_user(request, done_message(done) % {"count": done}, messages.SUCCESS)
        self._skipped(request, selected - done, why_skipped)

    @admin.action(
        description=_("Release: force running tasks back to pending (fences off the owner)"),
        permissions=["release"])
    def release(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._act(request, queryset, "release", cast(TaskQuerySet, queryset).force_release, lambda n: ngettext(
            "Released %(count)d task; its owner is fenced off.",
            "Released %(count)d tasks; their owners are fenced off.", n), str(_("not running")))

    @admin.action(description=_("Reset failed or cancelled tasks to pending"),
                  permissions=["reset"])
    def reset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._act(request, queryset, "reset", cast(TaskQuerySet, queryset).reset, lambda n: ngettext(
            "Reset %(count)d task to pending.", "Reset %(count)d tasks to pending.", n),
            str(_("not failed or cancelled")))

    @admin.action(description=_("Cancel unfinished tasks (fences off a running owner)"),
                  permissions=["cancel"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._act(request, queryset, "cancel", cast(TaskQuerySet, queryset).cancel, lambda n: ngettext(
            "Cancelled %(count)d task.", "Cancelled %(count)d tasks.", n), str(_("already finished")))


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdmin):
    """The outbox, read-only (a message changes only by a relay's fenced record of an answer): what
    waits for a relay, what was delivered, what failed and why."""

    list_display = ("id", "method", "url_display", "task_key", "tenant", "effect", "status", "attempts",
                    "answer_status", "next_try_at", "created_at", "delivered_at")
    list_filter = (TaskDatabaseFilter, "status", "method")
    search_fields = ("task_key", "idempotency_key", "url")
    ordering = ("-id",)
    list_per_page = 50
    show_full_result_count = False
    paginator = EstimatedCountPaginator

    exclude = ("headers",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # A message's own headers may hold a secret (an Authorization): their names, never their values.
        return [f.name if f.name != "headers" else "header_names" for f in self.model._meta.fields]

    @admin.display(description=_("headers (names only)"))
    def header_names(self, obj: OutboxMessage) -> str:
        return ", ".join(sorted(obj.headers or {})) or "—"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # A message lives in its task's database (recorded in the same transaction).
        return super().get_queryset(request).using(database_of(request))

    @admin.display(description=_("URL"), ordering="url")
    def url_display(self, obj: OutboxMessage) -> str:
        return obj.url if len(obj.url) <= 80 else obj.url[:79] + "…"
