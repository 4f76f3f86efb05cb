"""``django_taskclaim.downstream.fenced_endpoint`` in one process, through Django's test client.

The views (tests/testapp/downstream_views.py) write one ``Effect`` row per run, in the
decorator's transaction: counting rows counts the runs that committed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http import JsonResponse
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_taskclaim.downstream.models import FencingMark, StoredResponse
from django_taskclaim.idempotency import fencing_headers, idempotency_key
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db

FENCE = idempotency_key("acme", "order-1")


def headers(token: int | str, effect: str = "charge", fence: str = FENCE) -> dict[str, str]:
    return {"Idempotency-Key": idempotency_key("acme", "order-1", effect), "Taskclaim-Fencing-Key": fence,
            "Taskclaim-Fencing-Token": str(token)}


def post(path: str, hdrs: dict[str, str], body: object = None) -> object:
    return Client().post(path, json.dumps(body or {"amount": 10}), content_type="application/json", headers=hdrs)


def problem(response: Any) -> dict[str, Any]:
    """A refusal's body: ``application/problem+json``, its ``type`` telling refusals apart."""
    assert response["Content-Type"] == "application/problem+json", response
    return json.loads(response.content)  # type: ignore[no-any-return]


def runs(key: str = "k") -> int:
    return Effect.objects.filter(task_key=key).count()


def test_a_first_call_runs_the_view_and_records_token_and_response() -> None:
    response = post("/downstream/pay/k/", headers(3))
    assert (response.status_code, response.json()) == (201, {"paid": "k", "runs": 1})
    assert FencingMark.objects.get(fencing_key=FENCE).token == 3
    stored = StoredResponse.objects.get()
    assert (stored.status_code, stored.content_type, bytes(stored.body)) == (
        201, "application/json", response.content)
    assert stored.body_stored and stored.fencing_token == 3


def test_an_older_token_is_refused_with_409_and_the_view_never_runs() -> None:
    assert post("/downstream/pay/k/", headers(5, effect="a")).status_code == 201
    refused = post("/downstream/pay/k/", headers(4, effect="b"))
    assert refused.status_code == 409
    assert "older than 5" in problem(refused)["detail"]
    assert runs() == 1 and FencingMark.objects.get().token == 5
    assert StoredResponse.objects.count() == 1  # nothing recorded for the refused call's key
    # An older token is refused even for a key it had answered before (fencing comes first).
    assert post("/downstream/pay/k/", headers(4, effect="a")).status_code == 409


def test_a_higher_token_raises_the_mark_and_fences_the_older_owner_from_then_on() -> None:
    assert post("/downstream/pay/k/", headers(1, effect="a")).status_code == 201
    assert post("/downstream/pay/k/", headers(2, effect="b")).status_code == 201
    assert FencingMark.objects.get().token == 2
    assert post("/downstream/pay/k/", headers(1, effect="c")).status_code == 409
    assert post("/downstream/pay/k/", headers(2, effect="d")).status_code == 201  # equal: the owner itself
    assert runs() == 3


def test_a_repeated_key_gets_the_stored_response_without_running_the_view() -> None:
    first = post("/downstream/pay/k/", headers(1))
    again = post("/downstream/pay/k/", headers(2))  # a retry by the next owner: same key, same body
    assert runs() == 1
    assert (again.status_code, again.content, again["Content-Type"]) == (201, first.content, "application/json")
    assert again["Idempotent-Replayed"] == "true" and not first.has_header("Idempotent-Replayed")
    assert FencingMark.objects.get().token == 2


@pytest.mark.parametrize("change", ["body", "path", "method"])
def test_the_same_key_with_another_request_is_refused_with_422(change: str) -> None:
    assert post("/downstream/pay/k/", headers(1)).status_code == 201
    if change == "body":
        other = post("/downstream/pay/k/", headers(1), {"amount": 11})
    elif change == "path":
        other = post("/downstream/pay/k/?x=1", headers(1))
    else:
        other = Client().put("/downstream/pay/k/", json.dumps({"amount": 10}), content_type="application/json",
                             headers=headers(1))
    assert other.status_code == 422
    assert "Idempotency-Key" in problem(other)["detail"]
    assert runs() == 1


@pytest.mark.parametrize("missing", ["Idempotency-Key", "Taskclaim-Fencing-Key", "Taskclaim-Fencing-Token"])
def test_a_missing_header_is_a_400_naming_it(missing: str) -> None:
    hdrs = headers(1)
    del hdrs[missing]
    response = post("/downstream/pay/k/", hdrs)
    assert response.status_code == 400 and missing in problem(response)["detail"]
    assert runs() == 0 and not FencingMark.objects.exists() and not StoredResponse.objects.exists()


def test_require_fencing_false_applies_idempotency_only() -> None:
    key = {"Idempotency-Key": idempotency_key("", "x", "mail")}
    assert post("/downstream/unfenced/k/", key).status_code == 201
    assert post("/downstream/unfenced/k/", key).status_code == 201
    assert runs() == 1 and not FencingMark.objects.exists()
    # Fencing headers it is given are still checked.
    assert post("/downstream/unfenced/k/", headers(2)).status_code == 201
    assert post("/downstream/unfenced/k/", headers(1, effect="other")).status_code == 409
    assert post("/downstream/unfenced/k/", {}).status_code == 400


def test_a_view_that_raises_stores_nothing_and_a_retry_runs_it() -> None:
    with pytest.raises(RuntimeError, match="the view failed"):
        post("/downstream/pay/k/?answer=raise", headers(1))
    assert runs() == 0 and not StoredResponse.objects.exists() and not FencingMark.objects.exists()
    assert post("/downstream/pay/k/", headers(1)).status_code == 201  # another request: its own fingerprint
    assert runs() == 1


def test_a_5xx_answer_is_not_stored_and_the_views_writes_roll_back() -> None:
    assert post("/downstream/pay/k/?answer=500", headers(1)).status_code == 500
    assert runs() == 0 and not StoredResponse.objects.exists()
    assert post("/downstream/pay/k/?answer=500", headers(1)).status_code == 500  # retried: runs again
    assert runs() == 0


def test_a_response_too_large_to_store_keeps_its_status_without_its_body() -> None:
    first = post("/downstream/pay/k/?answer=big", headers(1))
    assert first.status_code == 201 and len(first.content) == 2 * 1024 * 1024
    stored = StoredResponse.objects.get()
    assert (stored.status_code, stored.body_stored, bytes(stored.body)) == (201, False, b"")
    again = post("/downstream/pay/k/?answer=big", headers(1))
    assert (again.status_code, again.content, again["Taskclaim-Body-Not-Stored"]) == (201, b"", "true")
    assert runs() == 1


@pytest.mark.parametrize("path", ["/downstream/class/k/", "/downstream/decorated/k/"])
def test_class_based_views_take_the_mixin_or_method_decorator(path: str) -> None:
    assert post(path, headers(2)).status_code == 201
    assert post(path, headers(2)).status_code == 201 and runs() == 1
    assert post(path, headers(1, effect="late")).status_code == 409 and runs() == 1


def test_a_response_rendered_late_is_rendered_and_stored_as_drf_needs() -> None:
    first = post("/downstream/class/k/?answer=template", headers(1))
    assert (first.status_code, first.content) == (201, b"paid k")
    again = post("/downstream/class/k/?answer=template", headers(1))
    assert (again.status_code, again.content, again["Content-Type"]) == (201, b"paid k", "text/plain")
    assert runs() == 1


def test_an_async_view_is_refused_when_decorated() -> None:
    from django_taskclaim.downstream import fenced_endpoint

    async def view(request: object) -> None:
        return None

    with pytest.raises(TypeError, match="async"):
        fenced_endpoint(view)
    with pytest.raises(TypeError, match="using"):
        fenced_endpoint(using=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_body"):
        fenced_endpoint(max_body=-1)


def test_the_admin_shows_both_models_read_only() -> None:
    user = User.objects.create_superuser("admin", "a@example.com", "pw")
    post("/downstream/pay/k/", headers(1))
    client = Client()
    client.force_login(user)
    for model in ("fencingmark", "storedresponse"):
        page = client.get(f"/admin/taskclaim_downstream/{model}/")
        assert page.status_code == 200
        assert client.get(f"/admin/taskclaim_downstream/{model}/add/").status_code == 403
    stored = StoredResponse.objects.get()
    change = client.get(f"/admin/taskclaim_downstream/storedresponse/{stored.pk}/change/")
    assert change.status_code == 200 and b"Save" not in change.content


HEADER_VALUES = st.one_of(
    st.text(max_size=300), st.integers().map(str), st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
    st.sampled_from(["", " 1", "1 ", "+1", "-1", "1.0", "0x10", "9" * 25, "١", "\u00b2", "1e3"]),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["Idempotency-Key", "Taskclaim-Fencing-Key", "Taskclaim-Fencing-Token"]),
       value=HEADER_VALUES)
def test_garbage_in_a_header_is_a_400_naming_it_never_a_500(name: str, value: str) -> None:
    hdrs = {**headers(1), name: value}
    try:
        response = post("/downstream/pay/hyp/", hdrs)
    except (ValueError, UnicodeError):  # the test client itself cannot send this value
        return
    assert response.status_code in (201, 400, 409, 422), response.content
    if response.status_code == 400:
        assert name in problem(response)["detail"]


def test_the_two_409s_have_their_own_problem_type_and_only_in_flight_has_retry_after() -> None:
    """A stale owner's 409 (never retry) and a 409 for the same key still running (retry later) are told
    apart by the problem ``type``, not by their text; only the second carries ``Retry-After``."""
    from django.test import RequestFactory

    from django_taskclaim.downstream import fenced_endpoint

    assert post("/downstream/pay/k/", headers(5, effect="a")).status_code == 201
    stale = post("/downstream/pay/k/", headers(4, effect="b"))
    assert (stale.status_code, problem(stale)["type"]) == (409, "urn:taskclaim:problem:stale-token")
    assert not stale.has_header("Retry-After")

    inner: list[Any] = []

    @fenced_endpoint
    def reentrant(request: Any) -> Any:
        if not inner:  # the same call again while the first still runs (inside its transaction)
            inner.append(reentrant(request))
        return JsonResponse({"ok": True}, status=201)

    request = RequestFactory().post("/r/", b"{}", content_type="application/json", headers=headers(6, effect="c"))
    assert reentrant(request).status_code == 201
    [in_flight] = inner
    assert (in_flight.status_code, problem(in_flight)["type"]) == (409, "urn:taskclaim:problem:in-flight")
    assert in_flight["Retry-After"] == "1"


def test_a_method_too_long_to_record_is_a_400_never_a_500() -> None:
    response = Client().generic("P" * 17, "/downstream/pay/k/", b"{}", content_type="application/json",
                                headers=headers(1))
    assert response.status_code == 400
    assert problem(response)["detail"] == "the method is 17 characters long; the limit is 16"
    assert runs() == 0 and not FencingMark.objects.exists() and not StoredResponse.objects.exists()
    sixteen = Client().generic("P" * 16, "/downstream/pay/k/", b"{}", content_type="application/json",
                               headers=headers(1))
    assert sixteen.status_code == 201  # the longest the record holds


def test_a_call_signed_with_any_of_the_services_keys_is_accepted(settings: Any) -> None:
    """Keys rotate: the caller signs with its first key, the service accepts each key it lists."""
    from django_taskclaim.idempotency import signature

    settings.TASKCLAIM_SIGNING_KEY = "old-secret"
    signed = fencing_headers("acme", "order-1", 3, "charge")
    assert signed["Taskclaim-Signature"] == signature(
        b"old-secret", FENCE, "3", idempotency_key("acme", "order-1", "charge"))
    settings.TASKCLAIM_SIGNING_KEY = ["new-secret", "old-secret"]
    assert post("/downstream/pay/k/", signed).status_code == 201
    assert post("/downstream/pay/k/", fencing_headers("acme", "order-1", 4, "other")).status_code == 201
    assert runs() == 2


def test_a_forged_token_is_refused_with_401_and_locks_no_one_out(settings: Any) -> None:
    """Without the key nobody can sign a token: a forged call (the highest token there is, unsigned
    or signed with another key) is a 401 that writes nothing, and the real owner's call goes through."""
    from django_taskclaim.idempotency import signature

    settings.TASKCLAIM_SIGNING_KEY = "the-shared-secret"
    forged = headers(9223372036854775807)
    unsigned = post("/downstream/pay/k/", forged, {"amount": 1_000_000})
    assert (unsigned.status_code, problem(unsigned)["type"]) == (401, "urn:taskclaim:problem:bad-signature")
    assert "missing" in str(problem(unsigned)["detail"]) and unsigned["WWW-Authenticate"] == "Taskclaim-Signature"
    wrong = {**forged, "Taskclaim-Signature": signature(b"a-guess", FENCE, str(2**63 - 1), forged["Idempotency-Key"])}
    assert post("/downstream/pay/k/", wrong, {"amount": 1_000_000}).status_code == 401
    # A real signature moved to another token (or key) does not match either.
    real = fencing_headers("acme", "order-1", 2, "charge")
    moved = {**real, "Taskclaim-Fencing-Token": "9223372036854775807"}
    assert post("/downstream/pay/k/", moved).status_code == 401
    assert runs() == 0 and not FencingMark.objects.exists() and not StoredResponse.objects.exists()
    assert post("/downstream/pay/k/", real).status_code == 201  # the real owner, never locked out
    assert FencingMark.objects.get().token == 2


def test_without_the_setting_calls_are_accepted_unsigned_or_signed() -> None:
    assert post("/downstream/pay/k/", headers(1)).status_code == 201
    junk = {**headers(1, effect="x"), "Taskclaim-Signature": "sha256=junk"}
    assert post("/downstream/pay/k/", junk).status_code == 201
