"""The registry's API: ``POST /artifacts/`` (fenced: a relay's repeat is answered, not run again)
and ``GET /artifacts/?run=…`` (what arrived, for the demo's summary)."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from django_taskclaim.downstream import fenced_endpoint

from .models import PublishedArtifact

FIELDS = {"tenant": str, "job_key": str, "run": str, "token": int, "artifact": str, "tests": int}


def bad(message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=400)


@csrf_exempt  # a service-to-service endpoint (the demo's relays); authenticate it your way
@require_http_methods(["GET", "POST"])
def artifacts(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        run = request.GET.get("run", "")
        rows = PublishedArtifact.objects.filter(run=run).values(*FIELDS)
        return JsonResponse({"run": run, "artifacts": list(rows)})
    return publish(request)


@fenced_endpoint  # Idempotency-Key and fencing token checked and recorded with the row below
def publish(request: HttpRequest) -> HttpResponse:
    try:
        data: Any = json.loads(request.body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return bad("the body is not JSON")
    if not isinstance(data, dict):
        return bad("the body must be a JSON object")
    for name, kind in FIELDS.items():
        # bool is an int in Python: refuse it for the numeric fields.
        if not isinstance(data.get(name), kind) or isinstance(data.get(name), bool):
            return bad(f"{name!r} is missing or not a {kind.__name__}")
    row = PublishedArtifact.objects.create(**{name: data[name] for name in FIELDS})
    return JsonResponse({"id": row.pk}, status=201)
