"""Fencing tokens carry the store's epoch (DESIGN §13), on every database.

Every claim's token is above every token of an earlier epoch: a token lost with a failed primary is
never handed out again by the promoted one. These tests raise the epoch with
``manage.py taskclaim_epoch --bump`` (what a failover tool's callback runs, and MySQL/MariaDB's only
way); tests/chaos/test_failover.py promotes a real PostgreSQL standby, whose timeline raises it.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection

from django_taskclaim.models import Attempt, Epoch, Task
from django_taskclaim.store.epochs import MAX_BUMPS_PER_TIMELINE, MAX_EPOCH, TOKEN_BITS, TOKENS_PER_EPOCH

pytestmark = pytest.mark.django_db(transaction=True)


def epoch(*args: str) -> dict:  # type: ignore[type-arg]
    out = StringIO()
    call_command("taskclaim_epoch", *args, "--json", stdout=out)
    return json.loads(out.getvalue())["databases"]["default"]  # type: ignore[no-any-return]


def test_a_bump_puts_every_later_token_above_every_earlier_one() -> None:
    held = Task.objects.claim("held", owner="old", lease=30).claim
    done = Task.objects.claim("done", owner="old").claim
    assert held and done
    done.complete("ok")
    Task.objects.claim("pending", owner="old").claim.release()  # type: ignore[union-attr]
    Task.objects.ensure("queued", queue="default")
    before = epoch()
    assert before["first_token"] <= 2  # never promoted nor bumped: today's tokens
    earlier = max(Task.objects.values_list("fencing_token", flat=True))

    after = epoch("--bump")
    assert after["epoch"] == before["epoch"] + 1
    assert after["before"]["epoch"] == before["epoch"]
    first = after["first_token"]
    assert first == (after["epoch"] << TOKEN_BITS) + 1 > earlier

    new = Task.objects.claim("new", owner="new").claim  # a key never seen
    again = Task.objects.claim("pending", owner="new").claim  # a task claimed before, in the old epoch
    [queued] = Task.objects.claim_next(owner="new", queue="default")
    from tests.conftest import expire
    expire(held)
    taken = Task.objects.claim("held", owner="new").claim  # a takeover across the epochs
    assert new and again and taken
    assert (new.token, again.token, queued.token, taken.token) == (first, first, first, first)
    # Within the epoch, one more per claim as before.
    again.release()
    assert Task.objects.claim("pending", owner="new").claim.token == first + 1  # type: ignore[union-attr]
    # The attempt taken over (token 1, the old epoch's) was closed by the claim that took it.
    outcomes = dict(Attempt.objects.filter(task__key="held").values_list("token", "outcome"))
    assert outcomes == {held.token: "taken_over", first: "running"}


def test_the_epoch_prints_and_a_bump_counts_up() -> None:
    out = StringIO()
    call_command("taskclaim_epoch", stdout=out)
    assert "database 'default': epoch " in out.getvalue()
    assert epoch("--bump")["epoch"] + 1 == epoch("--bump")["epoch"] == epoch()["epoch"]


def test_the_last_token_of_an_epoch_is_an_error_never_a_wrap() -> None:
    task = Task.objects.claim("busy", owner="a").claim
    assert task
    task.release()
    floor = epoch()["first_token"] - 1
    last = floor + TOKENS_PER_EPOCH
    Task.objects.filter(key="busy").update(fencing_token=last)
    with pytest.raises(DatabaseError) as raised:
        Task.objects.claim("busy", owner="b")
    if connection.vendor == "sqlite":  # the column refuses the NULL the claim computes
        assert "fencing_token" in str(raised.value)
    else:
        assert "taskclaim_task_token_within_its_epoch" in str(raised.value)
    row = Task.objects.get(key="busy")
    assert (row.status, row.fencing_token) == ("pending", last)
    # After a bump, the task's next claim is the new epoch's first token.
    first = epoch("--bump")["first_token"]
    assert Task.objects.claim("busy", owner="c").claim.token == first  # type: ignore[union-attr]


def test_a_bump_past_the_last_epoch_is_refused_and_changes_nothing() -> None:
    epoch("--bump")
    row = Epoch.objects.get(id=1)
    limit = MAX_BUMPS_PER_TIMELINE if connection.vendor == "postgresql" else MAX_EPOCH
    Epoch.objects.filter(id=1).update(bumps=limit)
    before = epoch()
    with pytest.raises(CommandError, match="is at its last epoch"):
        call_command("taskclaim_epoch", "--bump", stdout=StringIO())
    assert epoch() == before
    assert Epoch.objects.get(id=1).timeline == row.timeline


@pytest.mark.skipif("connection.vendor == 'postgresql'")
def test_a_bump_lost_with_the_old_primary_is_made_good_by_the_tokens_that_reached_the_new_one() -> None:
    """MySQL/MariaDB and SQLite have no timeline: a bump starts above the epoch of every token in the
    table, so the new primary does not hand out again an epoch whose tokens it already holds."""
    Task.objects.claim("seen", owner="a").claim.release()  # type: ignore[union-attr]
    Task.objects.filter(key="seen").update(fencing_token=(5 << TOKEN_BITS) + 3)  # epoch 5's, its bump lost
    assert epoch()["epoch"] == 0
    assert epoch("--bump")["epoch"] == 6
