"""Async views for the async tests: under Django's ``AsyncClient`` and under uvicorn (tests/programs/asgi.py).

``POST /run/<key>`` runs a coroutine once per key through ``arun_once``; every execution
writes an ``Effect`` row, so the tests count executions in the database.
"""

from __future__ import annotations

import asyncio
import os

from django.http import HttpRequest, JsonResponse
from django.urls import path

from django_taskclaim import arun_once
from django_taskclaim.exceptions import TaskBusy
from django_taskclaim.models import Task
from tests.testapp.models import Effect


async def run(request: HttpRequest, key: str) -> JsonResponse:
    """One execution per key, whoever asks and however often; every caller gets its result."""
    work_seconds = float(request.GET.get("work", "0.3"))
    worker = f"view-{os.getpid()}"

    async def work() -> dict[str, object]:
        await Effect.objects.acreate(task_key=key, token=0, worker=worker)
        await asyncio.sleep(work_seconds)  # the window the concurrent requests arrive in
        return {"key": key, "by": worker}

    try:
        result = await arun_once(key, work, on_busy=request.GET.get("on_busy", "wait"), lease=5)
    except TaskBusy:
        return JsonResponse({"busy": True, "served_by": worker}, status=409)
    return JsonResponse({"result": result, "served_by": worker})


async def fenced(request: HttpRequest, key: str) -> JsonResponse:
    """Claim, then write the effect and the completion in one fenced transaction from async code."""
    outcome = await Task.objects.aclaim(key, lease=5)
    if outcome.claim is None:
        return JsonResponse({"claimed": False, "status": outcome.task.status, "result": outcome.task.result})
    claim = outcome.claim

    def publish() -> int:
        Effect.objects.create(task_key=key, token=claim.token, worker="fenced-view")
        claim.complete({"token": claim.token})
        return claim.token

    return JsonResponse({"claimed": True, "token": await claim.afenced(publish)})


# No cookies or forms here; set the flag rather than wrap (csrf_exempt wraps async views only on Django 5).
run.csrf_exempt = fenced.csrf_exempt = True  # type: ignore[attr-defined]

urlpatterns = [path("run/<str:key>", run), path("fenced/<str:key>", fenced)]
