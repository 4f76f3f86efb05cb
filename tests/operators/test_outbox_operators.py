"""What an operator sees of the outbox: the read-only admin list with its status filter, and the
Prometheus gauges (messages by status, the oldest pending message's age)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone
from prometheus_client import CollectorRegistry

from django_taskclaim import metrics
from django_taskclaim.models import OutboxMessage, Task
from django_taskclaim.relay import Leased, claim_messages, record_answer

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:django_taskclaim_outboxmessage_changelist"


@pytest.fixture
def messages() -> dict[str, int]:
    """Three messages: one delivered, one failed, one pending (recorded ten minutes ago)."""
    ids = {}
    for name in ("delivered", "failed", "pending"):
        claim = Task.objects.claim(f"publish:{name}", lease=30).claim
        assert claim is not None
        with claim.fenced():
            ids[name] = claim.outbox.http("POST", f"http://127.0.0.1:9/{name}", json={"n": name})
            claim.complete(None)
    db = Task.objects.db
    leased: dict[int, Leased] = {m.id: m for m in claim_messages(db, owner="r#1", lease=30, batch=10)}
    assert record_answer(db, leased[ids["delivered"]], delivered=True, final=True, status_code=200, excerpt="")
    assert record_answer(db, leased[ids["failed"]], delivered=False, final=True, status_code=400, excerpt="no")
    assert record_answer(db, leased[ids["pending"]], delivered=False, final=False, status_code=503, excerpt="")
    OutboxMessage.objects.filter(pk=ids["pending"]).update(created_at=timezone.now() - dt.timedelta(minutes=10))
    return ids


def test_gauges_count_messages_by_status_and_the_oldest_pending_age(messages: dict[str, int]) -> None:
    registry = CollectorRegistry()
    metrics.install(registry)
    try:
        def value(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(name, {**labels, "database": Task.objects.db})

        for status in ("pending", "delivered", "failed"):
            assert value("taskclaim_outbox_messages", status=status) == 1
        age = value("taskclaim_outbox_oldest_pending_seconds")
        assert age is not None and 590 < age < 900
        OutboxMessage.objects.filter(pk=messages["pending"]).update(status="delivered")
        assert value("taskclaim_outbox_oldest_pending_seconds") == 0
        assert value("taskclaim_outbox_messages", status="delivered") == 2
    finally:
        metrics.uninstall(registry)


def test_admin_lists_messages_read_only_with_a_status_filter(client, messages: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    user = User.objects.create(username="viewer", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_taskclaim",
                                                        codename="view_outboxmessage"))
    client.force_login(user)
    listed = client.get(reverse(CHANGELIST))
    assert listed.status_code == 200
    assert {m.pk for m in listed.context["cl"].result_list} == set(messages.values())
    failed = client.get(reverse(CHANGELIST), {"status__exact": "failed"})
    assert [m.pk for m in failed.context["cl"].result_list] == [messages["failed"]]
    page = client.get(reverse("admin:django_taskclaim_outboxmessage_change", args=[messages["failed"]]))
    assert page.status_code == 200 and b"Save" not in page.content  # read-only
    delete = reverse("admin:django_taskclaim_outboxmessage_delete", args=[messages["failed"]])
    assert client.post(delete).status_code == 403


def test_admin_shows_a_messages_header_names_never_their_values(client, messages: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    OutboxMessage.objects.filter(pk=messages["failed"]).update(headers={"Authorization": "Bearer s3cr3t-token"})
    user = User.objects.create(username="viewer", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_taskclaim",
                                                        codename="view_outboxmessage"))
    client.force_login(user)
    page = client.get(reverse("admin:django_taskclaim_outboxmessage_change", args=[messages["failed"]]))
    assert page.status_code == 200
    assert b"Authorization" in page.content and b"s3cr3t" not in page.content
