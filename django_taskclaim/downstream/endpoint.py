"""``fenced_endpoint``: a view runs once per idempotency key, and never for a replaced owner.

In one transaction with the view's writes it locks the task's fencing mark (refusing a token
older than the highest seen) and the idempotency key's row (replaying the stored response of
a repeat), so the record and the effect commit together or not at all.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from django.db import router, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.utils import timezone

from ..idempotency import BAD_REQUEST, BAD_SIGNATURE, IN_FLIGHT, KEY_REUSED, STALE_TOKEN
from .calls import BadCall, BadSignature, Call, check_signature, read_call
from .models import FencingMark, StoredResponse
from .rows import lock_or_insert, take_write_lock

#: Bodies up to this many bytes are stored for replay; a larger one keeps only its status.
MAX_BODY = 1024 * 1024
REPLAYED = "Idempotent-Replayed"
BODY_NOT_STORED = "Taskclaim-Body-Not-Stored"
TITLES = {
    BAD_REQUEST: "The call's headers or method cannot be used",
    BAD_SIGNATURE: "The call is not signed with a key of this service",
    IN_FLIGHT: "A call with this Idempotency-Key is still running: retry later",
    STALE_TOKEN: "A newer owner of this task has called: this call must not be retried",
    KEY_REUSED: "This Idempotency-Key was used by another request",
}
#: Seconds an in-flight duplicate is told to wait before it calls again.
RETRY_AFTER = 1

V = TypeVar("V", bound=Callable[..., HttpResponseBase])


@dataclass(frozen=True)
class Options:
    """How one endpoint checks its calls (see :func:`fenced_endpoint`)."""

    using: str | None = None
    require_fencing: bool = True
    max_body: int = MAX_BODY

    def __post_init__(self) -> None:
        if self.using is not None and not isinstance(self.using, str):
            raise TypeError(f"fenced_endpoint(using=...) must be a database alias or None, not {self.using!r}")
        if not isinstance(self.require_fencing, bool):
            raise TypeError(f"fenced_endpoint(require_fencing=...) must be True or False, not {self.require_fencing!r}")
        if isinstance(self.max_body, bool) or not isinstance(self.max_body, int) or self.max_body < 0:
            raise TypeError(f"fenced_endpoint(max_body=...) must be a number of bytes ≥ 0, not {self.max_body!r}")


def _error(status: int, problem: str, message: str) -> JsonResponse:
    """A refusal as ``application/problem+json``: its ``type`` says which; ``error`` repeats the
    detail for clients of earlier versions."""
    body = {"type": problem, "title": TITLES[problem], "status": status, "detail": message, "error": message}
    response = JsonResponse(body, status=status, content_type="application/problem+json")
    if problem == IN_FLIGHT:
        response["Retry-After"] = str(RETRY_AFTER)
    elif problem == BAD_SIGNATURE:
        response["WWW-Authenticate"] = "Taskclaim-Signature"
    return response


def _replay(stored: StoredResponse) -> HttpResponse:
    response = HttpResponse(bytes(stored.body), status=stored.status_code, content_type=stored.content_type or None)
    response[REPLAYED] = "true"
    if not stored.body_stored:
        response[BODY_NOT_STORED] = "true"
    return response


def _rendered(response: HttpResponseBase) -> HttpResponseBase:
    # A TemplateResponse, or DRF's Response, holds no body until rendered (Django's handler
    # renders it after the view): render it now, to store the body it will send.
    render = getattr(response, "render", None)
    if callable(render) and not getattr(response, "is_rendered", True):
        render()
    return response


def _store(stored: StoredResponse, response: HttpResponseBase, using: str, max_body: int) -> None:
    body = b"" if response.streaming else response.content  # type: ignore[attr-defined]
    kept = not response.streaming and len(body) <= max_body
    StoredResponse.objects.using(using).filter(pk=stored.pk).update(
        status_code=response.status_code, content_type=response.get("Content-Type", ""),
        body=body if kept else b"", body_stored=kept,
    )


def answer(request: HttpRequest, run: Callable[[], HttpResponseBase], options: Options) -> HttpResponseBase:
    """The response to one fenced call: refused, replayed, or ``run()``'s, recorded with its writes."""
    try:
        call = read_call(request, require_fencing=options.require_fencing)
    except BadCall as exc:
        return _error(400, BAD_REQUEST, str(exc))
    try:
        check_signature(request, call)  # before any lock or row: a forged call changes nothing
    except BadSignature as exc:
        return _error(401, BAD_SIGNATURE, str(exc))
    using = options.using or router.db_for_write(StoredResponse)
    with transaction.atomic(using=using):
        take_write_lock(using)
        refused = _fence(call, using)
        if refused is not None:
            return refused
        stored, new = lock_or_insert(
            StoredResponse, using, {"idempotency_key": call.idempotency_key},
            {"fingerprint": call.fingerprint, "method": request.method or "", "path": request.get_full_path(),
             "status_code": 0, "fencing_key": call.fencing_key, "fencing_token": call.token},
        )
        if not new:
            if stored.fingerprint != call.fingerprint:
                return _error(422, KEY_REUSED,
                              "this Idempotency-Key was used by another request (method, path or body differ)")
            if stored.status_code == 0:  # only visible to the transaction that is running it
                return _error(409, IN_FLIGHT, "a call with this Idempotency-Key is in progress")
            return _replay(stored)
        response = _rendered(run())
        if response.status_code >= 500:
            # A server error is a failure: the view's writes and the key's record roll back, so
            # the caller's retry runs the view again.
            transaction.set_rollback(True, using=using)
            return response
        _store(stored, response, using, options.max_body)
        return response


def _fence(call: Call, using: str) -> JsonResponse | None:
    """A 409 for a token older than its key's mark (nothing written); else the mark raised to it."""
    if call.token is None:
        return None
    mark, _ = lock_or_insert(FencingMark, using, {"fencing_key": call.fencing_key}, {"token": call.token})
    if call.token < mark.token:
        return _error(409, STALE_TOKEN, f"Taskclaim-Fencing-Token {call.token} is older than {mark.token}, "
                                        "the highest seen for this Taskclaim-Fencing-Key: a newer owner has called")
    if call.token > mark.token:
        FencingMark.objects.using(using).filter(pk=mark.pk).update(token=call.token, updated_at=timezone.now())
    return None


@overload
def fenced_endpoint(view: V, /) -> V: ...
@overload
def fenced_endpoint(*, using: str | None = None, require_fencing: bool = True,
                    max_body: int = MAX_BODY) -> Callable[[V], V]: ...
def fenced_endpoint(view: V | None = None, /, *, using: str | None = None, require_fencing: bool = True,
                    max_body: int = MAX_BODY) -> V | Callable[[V], V]:
    """Decorate a (sync) view that performs an effect for a task of another service.

    ``@fenced_endpoint`` or ``@fenced_endpoint(using="payments", require_fencing=False,
    max_body=...)``; on a class-based view ``method_decorator(fenced_endpoint, name="dispatch")``
    or :class:`FencedEndpointMixin`. The view's writes must go to ``using`` (default: the router's
    database for ``StoredResponse``) to commit with the record.
    """
    options = Options(using, require_fencing, max_body)

    def decorate(func: V) -> V:
        if inspect.iscoroutinefunction(func):
            raise TypeError(f"fenced_endpoint wraps sync views only, and {func.__qualname__} is async: "
                            "Django has no async transactions (write it as a sync view; ASGI runs it in a thread)")

        @functools.wraps(func)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            return answer(request, lambda: func(request, *args, **kwargs), options)

        return wrapper  # type: ignore[return-value]

    return decorate if view is None else decorate(view)


class FencedEndpointMixin:
    """``fenced_endpoint`` for a class-based view, DRF's ``APIView`` included: put it first,
    ``class Pay(FencedEndpointMixin, APIView)``. Options as class attributes."""

    fenced_using: str | None = None
    fenced_require_fencing: bool = True
    fenced_max_body: int = MAX_BODY

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        options = Options(self.fenced_using, self.fenced_require_fencing, self.fenced_max_body)
        parent = super().dispatch  # type: ignore[misc]
        return answer(request, lambda: parent(request, *args, **kwargs), options)
