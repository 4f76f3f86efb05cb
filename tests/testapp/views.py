"""Views the configuration tests race with real processes (tests/databases/test_configurations.py)."""

from __future__ import annotations

import os
import time

from django.db import connections
from django.http import HttpRequest, JsonResponse

from django_taskclaim import run_once
from django_taskclaim.conf import settings
from django_taskclaim.exceptions import TaskBusy

from .models import Effect


def race(request: HttpRequest, key: str) -> JsonResponse:
    """``run_once`` in a view: the work writes an effect, then takes ``?work=`` seconds."""
    work_seconds = float(request.GET.get("work", "0.3"))
    in_request_transaction = connections[settings.DATABASE].in_atomic_block

    def work() -> dict[str, object]:
        Effect.objects.create(task_key=key, token=0, worker=str(os.getpid()))
        time.sleep(work_seconds)  # simulated work: the other requests arrive meanwhile
        return {"by": os.getpid()}

    try:
        result = run_once(key, work, on_busy=request.GET.get("on_busy", "wait"))
    except TaskBusy:
        return JsonResponse({"busy": True}, status=409)
    return JsonResponse({"result": result, "atomic": in_request_transaction})
