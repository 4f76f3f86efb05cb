"""``@claim_options(concurrency_key=..., concurrency_limit=N)`` on Django tasks: each enqueued task
carries its key (a string, or what the callable makes of its arguments) and the limit, and the queue
claim keeps at most N of a key running."""

from __future__ import annotations

import pytest

from django_taskclaim.exceptions import InvalidArgument
from django_taskclaim.models import Task
from django_taskclaim.tasks import claim_options, enqueue_many
from tests.testapp import limited_tasks

pytestmark = pytest.mark.django_db


def test_the_key_is_made_from_the_tasks_arguments() -> None:
    for account in ("a", "a", "a", "b"):
        limited_tasks.call_api.enqueue(account)
    assert sorted(Task.objects.values_list("concurrency_key", "concurrency_limit")) == [
        ("api:a", 2), ("api:a", 2), ("api:a", 2), ("api:b", 2)]
    claims = Task.objects.claim_next(path="*", limit=10)
    keys = sorted(Task.objects.get(pk=c.task_id).concurrency_key for c in claims)
    assert keys == ["api:a", "api:a", "api:b"]


def test_a_fixed_key() -> None:
    for n in range(3):
        limited_tasks.build_report.enqueue(n)
    assert len(Task.objects.claim_next(path="*", limit=10)) == 1


def test_enqueue_many_gives_each_task_its_key() -> None:
    enqueue_many(limited_tasks.call_api, [(("a",), {}), (("b",), {}), (("a",), {})])
    assert sorted(Task.objects.values_list("concurrency_key", flat=True)) == ["api:a", "api:a", "api:b"]


@pytest.mark.parametrize(("options", "problem"), [
    ({"concurrency_key": "x"}, "go together"),
    ({"concurrency_limit": 2}, "go together"),
    ({"concurrency_key": "x", "concurrency_limit": 0}, "positive integer"),
    ({"concurrency_key": "", "concurrency_limit": 1}, "go together"),
])
def test_bad_options_are_refused_at_decoration(options: dict[str, object], problem: str) -> None:
    with pytest.raises(InvalidArgument, match=problem):
        claim_options(**options)  # type: ignore[arg-type]


def test_a_callable_that_gives_no_key_is_refused_at_enqueue() -> None:
    from django_taskclaim.tasks.identity import ClaimOptions

    options = ClaimOptions(concurrency_key=lambda n: "", concurrency_limit=1)
    with pytest.raises(InvalidArgument, match="non-empty string"):
        options.concurrency((1,), {})
