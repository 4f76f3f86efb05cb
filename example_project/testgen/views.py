"""The job API and the jobs page.

``POST /api/jobs``  request a suite: ``{"tenant", "run", "service", "endpoint"}``, optionally
                    ``"version"`` and ``"framework"``
                    -> 201 (new job) or 200 (already requested: the same job, not a second one);
                    409 when the same job arrives with other input; 400 for bad input.
``GET /api/jobs``   the jobs and their state (``?run=run-42`` for one run), as JSON.
``GET /``           the same as an HTML page that refreshes itself.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods

from django_taskclaim.claims import ensure_task
from django_taskclaim.exceptions import InvalidTaskKey, PayloadMismatch
from django_taskclaim.models import Task

from .jobs import OPERATION, JobSpec

REQUIRED = ("tenant", "run", "service", "endpoint")
OPTIONAL = {"version": "v1", "framework": "pytest"}


def request_job(spec: JobSpec) -> tuple[Task, bool]:
    """Create the job's task (PENDING) unless it exists: ``(task, created)``. Idempotent.

    ``TESTGEN_DISPATCH = "tasks"`` enqueues it through Django's Tasks framework (for
    ``taskclaim_worker``); ``"celery"`` also publishes the Celery task, once, on commit.
    ``created`` is what the insert itself found, never a look beforehand: of two requests
    racing for a new job, one is told 201 and the other 200.
    """
    if settings.TESTGEN_DISPATCH not in ("tasks", "celery"):
        return ensure_task(spec.task_key, payload=spec.payload)
    with transaction.atomic():  # the request's transaction: the task row commits or rolls back with it
        return enqueue_task(spec) if settings.TESTGEN_DISPATCH == "tasks" else publish_celery(spec)


#: The ids of the tasks the backend created in this context (``enqueue_task``), while it watches.
_created: ContextVar[list[str] | None] = ContextVar("testgen_created", default=None)


def _note_created(sender: Any, task_result: Any, **kwargs: Any) -> None:
    # The backend sends task_enqueued for a task it created, not for an identity met again.
    created = _created.get()
    if created is not None:
        created.append(str(task_result.id))


def enqueue_task(spec: JobSpec) -> tuple[Task, bool]:
    """The job as a Django task keyed by its ``TaskKey``: one task however often it is requested."""
    from .jobs_tasks import generate_suite, task_enqueued  # imported in this mode only

    task_enqueued.connect(_note_created, dispatch_uid="testgen-created")  # once: connect() is idempotent
    made: list[str] = []
    watching = _created.set(made)
    try:
        result = generate_suite.enqueue(spec.tenant, spec.run, spec.payload)
    finally:
        _created.reset(watching)
    return Task.objects.get(pk=result.id), result.id in made  # a result's id is its task row's


def publish_celery(spec: JobSpec) -> tuple[Task, bool]:
    # Imported here so that the demo without Celery never imports it.
    from django_taskclaim.celery import enqueue_once

    from .tasks import generate_suite

    # Creates the row in this transaction and publishes on commit; a key that is already
    # pending, running or done is not published again.
    sent = enqueue_once(generate_suite, key=spec.task_key, args=(spec.tenant, spec.run, spec.payload))
    return ensure_task(spec.task_key, payload=spec.payload)[0], sent.created  # stores the payload's fingerprint


def jobs_state(run: str | None = None) -> list[dict[str, Any]]:
    """The jobs (optionally of one run) with their state, newest first."""
    tasks = Task.objects.filter(key__contains=f":{OPERATION}")
    if run:
        tasks = tasks.filter(key__startswith=f"{run}:")
    tasks = tasks.annotate(
        claims=Count("attempt_set", filter=Q(attempt_set__token__isnull=False)),
        duplicates=Count("attempt_set", filter=Q(attempt_set__outcome="duplicate")),
    ).order_by("-id")[:500]
    return [
        {
            "tenant": t.tenant,
            "key": t.key,
            "status": t.status,
            "owner": t.owner,
            "token": t.fencing_token,
            "attempts": t.attempts,
            "claims": t.claims,
            "duplicates_refused": t.duplicates,
            "lease_expires_at": t.lease_expires_at.isoformat() if t.lease_expires_at else None,
            "result": t.result,
            "artifact": t.result_ref,
            "error": t.error,
            "updated_at": t.updated_at.isoformat(),
        }
        for t in tasks
    ]


def parse_spec(body: Any) -> JobSpec:
    """The job a request body asks for; ``ValueError`` says what is wrong with it."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    missing = [f for f in REQUIRED if not body.get(f)]
    if missing:
        raise ValueError(f"missing field(s): {', '.join(missing)}")
    unknown = sorted(set(body) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(unknown)}")
    values = {f: body.get(f, OPTIONAL.get(f)) for f in (*REQUIRED, *OPTIONAL)}
    bad = [f for f, v in values.items() if not isinstance(v, str) or not v]
    if bad:
        raise ValueError(f"field(s) must be non-empty strings: {', '.join(bad)}")
    return JobSpec(**values)


# An API for programs (the demo, a CI pipeline), authenticated by nothing in this example and
# never by a session cookie, so CSRF protection does not apply.
@csrf_exempt
@require_http_methods(["GET", "POST"])
def jobs_api(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return JsonResponse({"jobs": jobs_state(request.GET.get("run") or None)})
    try:
        spec = parse_spec(json.loads(request.body or b"null"))
        key = spec.task_key  # validates the parts
    except (ValueError, InvalidTaskKey) as exc:  # JSONDecodeError is a ValueError
        return JsonResponse({"error": str(exc)}, status=400)
    try:
        task, created = request_job(spec)
    except (PayloadMismatch, InvalidTaskKey) as exc:  # the job exists, with other input (or as other work)
        return JsonResponse({"error": str(exc), "key": key.key, "tenant": key.tenant}, status=409)
    return JsonResponse(
        {"key": task.key, "tenant": task.tenant, "status": task.status, "created": created},
        status=201 if created else 200,
    )


@require_GET
def jobs_page(request: HttpRequest) -> HttpResponse:
    run = request.GET.get("run") or None
    jobs = jobs_state(run)
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job["status"]] = counts.get(job["status"], 0) + 1
    return render(
        request, "testgen/jobs.html", {"jobs": jobs, "run": run, "counts": sorted(counts.items())}
    )
