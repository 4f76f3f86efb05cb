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
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods

from django_taskclaim.exceptions import InvalidTaskKey, PayloadMismatch

from .jobs import JobSpec, jobs_state, request_job

REQUIRED = ("tenant", "run", "service", "endpoint")
OPTIONAL = {"version": "v1", "framework": "pytest"}


def _spec(body: Any) -> JobSpec:
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
        spec = _spec(json.loads(request.body or b"null"))
        key = spec.task_key  # validates the parts
    except (ValueError, InvalidTaskKey) as exc:  # JSONDecodeError is a ValueError
        return JsonResponse({"error": str(exc)}, status=400)
    try:
        task, created = request_job(spec)
    except PayloadMismatch as exc:
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
