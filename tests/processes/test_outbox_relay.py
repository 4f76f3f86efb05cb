"""The outbox end to end, with real processes and real HTTP: messages recorded with their tasks'
completions, relays (``manage.py taskclaim_relay``) SIGKILLed mid-delivery — after the downstream
took the effect, before the answer reached them — and relays that replace them. Each message
takes effect downstream exactly once (by its Idempotency-Key), none is lost, and each is
recorded delivered."""

from __future__ import annotations

import pytest

from devtools.processes import Supervisor
from django_taskclaim.downstream.models import StoredResponse
from django_taskclaim.idempotency import idempotency_key
from django_taskclaim.models import OutboxMessage, Task
from tests.conftest import expire
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

TASKS = 6
HELD = 2  # relays killed with a delivery in hand
# A relay holds a message 3 s: the one that replaces a killed relay sends it again after that.
# Its HTTP timeout (2 s) leaves the test that long to kill a relay whose request is held.
RELAY = ("--lease", "3", "--timeout", "1.9", "--batch", "1", "--backoff", "0.1")


def record(url: str) -> list[str]:
    """Complete ``TASKS`` tasks, each with one outbox message to ``url`` (``{n}`` the task's
    number); their idempotency keys."""
    keys = []
    for n in range(TASKS):
        claim = Task.objects.claim(f"publish:{n}", lease=30).claim
        assert claim is not None
        with claim.fenced():
            claim.outbox.http("POST", url.format(n=n), json={"n": n}, effect="publish")
            claim.complete({"n": n})
        keys.append(idempotency_key("", f"publish:{n}", "publish"))
    return keys


def test_relays_killed_mid_delivery_each_message_takes_effect_once(processes: Supervisor) -> None:
    downstream = processes.start("tests.programs.effect_counter", str(HELD))
    port = downstream.event("ready", timeout=30)["port"]
    keys = record(f"http://127.0.0.1:{port}/effects")

    doomed = [processes.start("django", "taskclaim_relay", *RELAY) for _ in range(HELD)]
    held = {downstream.event("held", timeout=30)["key"] for _ in range(HELD)}
    for relay in doomed:
        relay.kill()  # each holds one message: its request took effect, its answer never came
    for relay in doomed:
        relay.wait(10)
    # Killed mid-delivery: neither recorded an answer, both messages still leased to a dead relay.
    stuck = OutboxMessage.objects.filter(idempotency_key__in=held)
    assert [(m.status, m.answer_status) for m in stuck] == [("pending", None)] * HELD
    assert all(m.lease_expires_at is not None and m.attempts == 1 for m in stuck)

    downstream.send("release")  # the replacements' requests are answered at once
    survivors = [processes.start("django", "taskclaim_relay", *RELAY, "--until-drained", "--json")
                 for _ in range(2)]
    summaries = [relay.finish(60) for relay in survivors]

    downstream.send("report")
    report = downstream.event("report", timeout=10)
    assert report["effects"] == dict.fromkeys(keys, 1)  # each exactly once, none lost
    assert {key for key, n in report["seen"].items() if n > 1} == held  # sent again, recognised
    assert sum(s["delivered"] for s in summaries) == TASKS  # the replacements delivered everything
    messages = OutboxMessage.objects.order_by("id")
    assert [(m.status, m.answer_status) for m in messages] == [("delivered", 200)] * TASKS
    assert sorted(m.attempts for m in messages) == [1] * (TASKS - HELD) + [2] * HELD


def test_relays_killed_mid_delivery_to_a_fenced_endpoint_take_effect_once(processes: Supervisor) -> None:
    """The same against a Django service on ``fenced_endpoint`` (its own process, served over
    HTTP): the killed relays' calls took effect (their transactions committed, the answers held);
    the replacements' calls with the same Idempotency-Key get the stored response and the view
    does not run again."""
    downstream = processes.start("tests.programs.downstream", "serve", str(HELD))
    port = downstream.event("ready", timeout=30)["port"]
    keys = record(f"http://127.0.0.1:{port}/downstream/held/publish-{{n}}/")

    doomed = [processes.start("django", "taskclaim_relay", *RELAY) for _ in range(HELD)]
    held = {downstream.event("held", timeout=30)["key"] for _ in range(HELD)}
    for relay in doomed:
        relay.kill()
    for relay in doomed:
        relay.wait(10)
    downstream.send("release")  # the held answers go to relays that are gone
    survivors = [processes.start("django", "taskclaim_relay", *RELAY, "--until-drained", "--json")
                 for _ in range(2)]
    summaries = [relay.finish(60) for relay in survivors]

    effects = dict.fromkeys((f"publish-{n}" for n in range(TASKS)), 0)
    for effect in Effect.objects.all():
        effects[effect.task_key] += 1
    assert effects == dict.fromkeys(effects, 1)  # each exactly once, none lost
    assert held <= set(keys) and StoredResponse.objects.count() == TASKS
    assert sum(s["delivered"] for s in summaries) == TASKS
    messages = OutboxMessage.objects.order_by("id")
    assert [(m.status, m.answer_status) for m in messages] == [("delivered", 201)] * TASKS
    assert sorted(m.attempts for m in messages) == [1] * (TASKS - HELD) + [2] * HELD


def test_an_owner_paused_past_its_lease_records_no_message(processes: Supervisor, spawn) -> None:  # type: ignore[no-untyped-def]
    """A worker SIGSTOPped after its claim, whose lease runs out and whose task is taken over and
    completed with a message of the new owner's: woken, its fenced() block is refused and its
    message never exists — only the new owner's is there to deliver."""
    url = "http://127.0.0.1:9/publish"
    owner = spawn("outbox-owner", "report", "--lease", "30", "--url", url)
    assert owner.event("claimed", timeout=60)["token"] == 1
    owner.stop()
    expire(Task.objects.get(key="report"))  # its lease ran out while it was paused
    thief = Task.objects.claim("report", owner="thief", lease=30).claim
    assert thief is not None and thief.token == 2
    with thief.fenced():
        thief.outbox.http("POST", url, json={"by": "thief"}, effect="publish")
        thief.complete({"by": "thief"})
    owner.send("go")
    owner.cont()
    assert owner.finish(60) == {"event": "stale", "token": 1}
    assert list(OutboxMessage.objects.values_list("token", "body")) == [(2, {"by": "thief"})]
