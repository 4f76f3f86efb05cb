"""A downstream service's views for the tests of ``django_taskclaim.downstream``.

Each run of a view writes one ``Effect`` row (``task_key`` = the URL's ``key``): the tests count
the view's runs in the database. ``?answer=`` picks how the view ends.
"""

from __future__ import annotations

import os
import sys
import threading

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template import engines
from django.template.response import SimpleTemplateResponse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt

from devtools.events import emit
from django_taskclaim.downstream import FencedEndpointMixin, fenced_endpoint

from .models import Effect

BIG = 2 * 1024 * 1024


#: A served downstream (tests/programs/downstream.py ``serve HOLD``) holds the answers to the first
#: HOLD calls of ``pay_held``, after their effect committed, until ``RELEASED`` is set: a caller
#: killed then never hears the answer to a call that took effect.
HOLD = {"left": 0}
RELEASED = threading.Event()
_holding = threading.Lock()


def _effect(request: HttpRequest, key: str) -> HttpResponse:
    token = request.headers.get("Taskclaim-Fencing-Token", "")
    Effect.objects.create(task_key=key, token=int(token) if token.isdigit() else 0, worker=str(os.getpid()))
    if request.headers.get("X-Test-Hold"):  # a process test holds the view inside its transaction
        emit(event="inside", key=key)
        sys.stdin.readline()
    answer = request.GET.get("answer", "")
    if answer == "raise":
        raise RuntimeError("the view failed")
    if answer == "500":
        return JsonResponse({"error": "try later"}, status=500)
    if answer == "big":
        return HttpResponse(b"x" * BIG, content_type="application/octet-stream", status=201)
    if answer == "template":  # rendered late, as DRF's Response is
        template = engines["django"].from_string("paid {{ key }}")
        return SimpleTemplateResponse(template, {"key": key}, status=201, content_type="text/plain")
    return JsonResponse({"paid": key, "runs": Effect.objects.filter(task_key=key).count()}, status=201)


@csrf_exempt
@fenced_endpoint
def pay(request: HttpRequest, key: str) -> HttpResponse:
    return _effect(request, key)


@csrf_exempt
def pay_held(request: HttpRequest, key: str) -> HttpResponse:
    """``pay``, whose answer may be held (see ``HOLD``) once its transaction committed."""
    response = pay(request, key)
    with _holding:
        hold, HOLD["left"] = HOLD["left"] > 0, max(0, HOLD["left"] - 1)
    if hold:
        emit(event="held", key=request.headers.get("Idempotency-Key", ""))
        RELEASED.wait(120)
    return response


@csrf_exempt
@fenced_endpoint(require_fencing=False)
def pay_unfenced(request: HttpRequest, key: str) -> HttpResponse:
    return _effect(request, key)


@method_decorator(csrf_exempt, name="dispatch")
class PayView(FencedEndpointMixin, View):
    """The mixin form, as a DRF ``APIView`` takes it: ``class V(FencedEndpointMixin, APIView)``."""

    def post(self, request: HttpRequest, key: str) -> HttpResponse:
        return _effect(request, key)


@method_decorator([csrf_exempt, fenced_endpoint], name="dispatch")
class DecoratedPayView(View):
    def post(self, request: HttpRequest, key: str) -> HttpResponse:
        return _effect(request, key)
