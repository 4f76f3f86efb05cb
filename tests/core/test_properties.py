"""Property-based tests (Hypothesis) over the public API's inputs, on the database of the run.

For every generated input, a call either succeeds and leaves rows the ORM and the admin load,
or raises a ``TaskClaimError`` subclass and changes nothing. And no sequence of calls runs a
``run_once`` function a second time for a key whose work already ran.

``TASKCLAIM_HYPOTHESIS_EXAMPLES`` sets the examples per property (default 100; the stateful test
runs half as many sequences of up to 12 steps). CI derandomizes, so a run is reproducible.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from django_taskclaim import TaskKey, run_once
from django_taskclaim.exceptions import InvalidResult, TaskClaimError, TaskFailed
from django_taskclaim.models import Attempt, Task
from tests.conftest import expire

pytestmark = [pytest.mark.django_db(transaction=True)]

EXAMPLES = int(os.environ.get("TASKCLAIM_HYPOTHESIS_EXAMPLES", "100"))
settings.register_profile(
    "taskclaim", max_examples=EXAMPLES, deadline=None, derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = settings.get_profile("taskclaim")

# Every code point, surrogates included, with the awkward ones made likely.
ANY_CHAR = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=())
AWKWARD = st.sampled_from(["", "\x00", "\ud800", "\udfff", "a\x00b", "x" * 255, "x" * 256, ":", "@", "%",
                           "\u2028", "é", "\U0001f600", " ", "\t", "\\u0000"])
TEXT = st.one_of(AWKWARD, st.text(ANY_CHAR, max_size=20), st.text(ANY_CHAR, min_size=250, max_size=260))
# Valid values, as likely as the awkward ones, so that successes are explored as well as refusals.
NON_PRINTABLE = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs")
PLAIN = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF, exclude_categories=NON_PRINTABLE),
                min_size=1, max_size=30)
KEYS = st.one_of(PLAIN, PLAIN, PLAIN, PLAIN, TEXT, st.integers(), st.none(),
                 st.builds(lambda op, run: TaskKey(op, run=run), st.sampled_from(["op", "b"]),
                           st.one_of(st.none(), st.uuids(), st.integers(0, 9))))
LEASES = st.one_of(
    st.none(), st.none(), st.floats(0.1, 7 * 24 * 3600), st.floats(), st.integers(-5, 10**13), st.timedeltas(),
    st.sampled_from([0, 0.05, 0.1, 1, 30, 7 * 24 * 3600, 7 * 24 * 3600 + 1, 1e12, 10**400, True, "30"]),
)
SCALARS = st.one_of(AWKWARD, st.none(), st.booleans(), st.integers(), st.integers(-(2**70), 2**70), st.floats(), TEXT,
                    st.decimals(), st.datetimes(timezones=st.sampled_from([None, dt.UTC])), st.uuids())
JSONISH = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4),
    st.dictionaries(st.integers(), inner, max_size=2), st.sets(st.integers(), max_size=3)), max_leaves=8)
OWNERS = st.one_of(st.none(), PLAIN, TEXT, st.integers())
ATTEMPTS = st.one_of(st.none(), st.integers(1, 10), st.integers(-3, 2**40), st.booleans(),
                     st.sampled_from([2**31 - 1, 2**31]))
LONG = st.builds(lambda part, n: part * n, st.text(ANY_CHAR, min_size=1, max_size=4), st.integers(2_500, 6_000))
ERRORS = st.one_of(TEXT, st.builds(ValueError, TEXT), LONG)


def mostly(valid: st.SearchStrategy[Any], awkward: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``valid`` three times in four: so that one awkward argument among valid ones is common."""
    # (one_of() does not weight repeated branches: draw the choice itself.)
    return st.integers(0, 3).flatmap(lambda choice: valid if choice else awkward)


def snapshot() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return list(Task.objects.order_by("pk").values()), list(Attempt.objects.order_by("pk").values())


_admin: list[Client] = []


def admin() -> Client:
    if not _admin or not User.objects.filter(username="prop-admin").exists():
        client = Client()
        client.force_login(User.objects.create_superuser("prop-admin", "a@example.com", "x"))
        _admin[:] = [client]
    return _admin[0]


def loads_everywhere(task_id: int) -> None:
    """The rows load through the ORM and render in the admin (list and detail).

    The list shows this example's task alone: the rows of earlier examples were rendered in
    their own example, and rendering up to a page of them again made each example cost ~0.1 s.
    """
    task = Task.objects.get(pk=task_id)
    list(task.attempt_set.all())
    str(task), task.lease_remaining(), task.is_terminal
    [a.as_dict() for a in Attempt.objects.filter(task_id=task_id)]
    client = admin()
    listed = client.get(reverse("admin:django_taskclaim_task_changelist"), {"id": task_id})
    assert listed.status_code == 200
    assert [row.pk for row in listed.context["cl"].result_list] == [task_id]  # rendered, not an error page
    assert client.get(reverse("admin:django_taskclaim_task_change", args=[task_id])).status_code == 200


def either_succeeds_or_changes_nothing(call: Any) -> Any:
    """Run ``call``: a TaskClaimError must leave every row as it was; anything else must not be raised."""
    before = snapshot()
    try:
        value = call()
    except TaskClaimError as exc:
        event(f"refused: {type(exc).__name__}")
        assert snapshot() == before, "a refused call changed stored rows"
        return None
    event("succeeded")
    return value


@settings(PROFILE)
@given(key=mostly(PLAIN, KEYS), tenant=mostly(st.just(""), TEXT), owner=mostly(st.none(), OWNERS),
       lease=mostly(st.none(), LEASES), payload=mostly(st.none(), JSONISH), max_attempts=mostly(st.none(), ATTEMPTS),
       delivery_id=mostly(st.just(""), TEXT))
def test_claim_any_input(key, tenant, owner, lease, payload, max_attempts, delivery_id) -> None:  # type: ignore[no-untyped-def]
    if isinstance(key, TaskKey):
        tenant = ""
    outcome = either_succeeds_or_changes_nothing(lambda: Task.objects.claim(
        key, tenant=tenant, owner=owner, lease=lease, payload=payload, max_attempts=max_attempts,
        delivery_id=delivery_id))
    if outcome is not None:
        loads_everywhere(outcome.task.pk)


@settings(PROFILE)
@given(key=mostly(PLAIN, KEYS), tenant=mostly(st.just(""), TEXT), payload=mostly(st.none(), JSONISH),
       max_attempts=mostly(st.none(), ATTEMPTS))
def test_ensure_any_input(key, tenant, payload, max_attempts) -> None:  # type: ignore[no-untyped-def]
    if isinstance(key, TaskKey):
        tenant = ""
    task = either_succeeds_or_changes_nothing(
        lambda: Task.objects.ensure(key, tenant=tenant, payload=payload, max_attempts=max_attempts))
    if task is not None:
        loads_everywhere(task.pk)


@settings(PROFILE)
@given(lease=LEASES, result=st.one_of(st.none(), JSONISH), result_ref=st.one_of(st.just(""), TEXT, st.integers()),
       error=ERRORS, retry=st.booleans(), step=st.sampled_from(["heartbeat", "complete", "fail"]))
def test_claim_methods_any_input(lease, result, result_ref, error, retry, step) -> None:  # type: ignore[no-untyped-def]
    claim = Task.objects.claim(f"m-{uuid.uuid4()}", lease=30).claim
    assert claim is not None
    if step == "heartbeat":
        either_succeeds_or_changes_nothing(lambda: claim.heartbeat(lease))
    elif step == "complete":
        either_succeeds_or_changes_nothing(lambda: claim.complete(result, result_ref))
    else:
        # The failure path never fails on the error's text.
        assert claim.fail(error, retry=retry) in ("pending", "failed")
        assert "\x00" not in Task.objects.get(pk=claim.task_id).error
    loads_everywhere(claim.task_id)


KEY_POOL = ["k1", "k2", "k3"]


class RunOnceMachine(RuleBasedStateMachine):
    """Sequences of run_once calls and of other workers' claims: a key's work never runs after it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: dict[str, int] = {}
        self.done: set[str] = set()  # the work ran to its end (stored, or refused as a result)

    @initialize()
    def clean(self) -> None:
        Task.objects.all().delete()

    def _func(self, key: str, result: Any, raises: bool) -> Any:
        def work() -> Any:
            assert key not in self.done, f"the work of {key!r} ran a second time"
            self.runs[key] = self.runs.get(key, 0) + 1
            if raises:
                raise RuntimeError("work failed")  # a failure may be retried: not "done"
            self.done.add(key)
            return result
        return work

    @rule(key=st.sampled_from(KEY_POOL), result=st.one_of(st.none(), JSONISH), raises=st.booleans(),
          payload=st.sampled_from([None, {"v": 1}, {"v": 2}]))
    def call(self, key: str, result: Any, raises: bool, payload: Any) -> None:
        with contextlib.suppress(RuntimeError, InvalidResult, TaskClaimError):
            run_once(key, self._func(key, result, raises), payload=payload, lease=5)

    @rule(key=st.sampled_from(KEY_POOL))
    def another_worker_dies_holding_it(self, key: str) -> None:
        outcome = Task.objects.claim(key, owner="mortal", lease=5)
        if outcome.claimed:
            expire(outcome.task)  # its owner vanished; the next caller takes over

    @rule(key=st.sampled_from(KEY_POOL), action=st.sampled_from(["release", "fail-retry", "fail"]))
    def another_worker_gives_up(self, key: str, action: str) -> None:
        outcome = Task.objects.claim(key, owner="quitter", lease=5)
        if outcome.claim is not None:
            if action == "release":
                outcome.claim.release()
            else:
                outcome.claim.fail("gave up", retry=action == "fail-retry")

    @rule()
    def sweep(self) -> None:
        Task.objects.reclaim_expired()

    @invariant()
    def done_tasks_never_run_again(self) -> None:
        for key in self.done:
            status = Task.objects.filter(key=key).values_list("status", flat=True).first()
            assert status in ("succeeded", "failed"), f"{key!r} ran but is {status}"
            if status == "failed":
                with pytest.raises(TaskFailed):
                    run_once(key, self._func(key, None, False))


def test_no_sequence_runs_a_key_twice() -> None:
    run_state_machine_as_test(RunOnceMachine, settings=settings(
        PROFILE, max_examples=max(EXAMPLES // 2, 5), stateful_step_count=12))
