"""A claim's progress (``claim.progress()``, ``aprogress()``): a fenced write, refused to a stale
owner and to bad input with nothing written; shown by ``taskclaim_inspect``."""

from __future__ import annotations

import asyncio
import io
import json
import math
import os

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.db import connections
from hypothesis import given, settings
from hypothesis import strategies as st

from django_taskclaim.dashboard import progress_text
from django_taskclaim.exceptions import InvalidArgument, StaleClaim
from django_taskclaim.models import Attempt, Task
from tests.conftest import expire

pytestmark = pytest.mark.django_db(transaction=True)

PROGRESS = ("progress", "progress_note", "progress_token")


def claim_of(key: str, owner: str = "w1"):  # type: ignore[no-untyped-def]
    outcome = Task.objects.claim(key, owner=owner, lease=30)
    assert outcome.claimed
    return outcome.claim


def stored(key: str) -> tuple[object, ...]:
    return tuple(Task.objects.values_list(*PROGRESS).get(key=key))


def test_progress_is_stored_with_the_token_that_wrote_it() -> None:
    claim = claim_of("job")
    assert stored("job") == (None, None, None)
    claim.progress(0.25, "copying")
    assert stored("job") == (0.25, "copying", 1)
    claim.progress(1)
    assert stored("job") == (1.0, "", 1)
    assert progress_text(Task.objects.get(key="job")) == "100% (token 1)"


def test_a_stale_owner_s_progress_is_refused_and_writes_nothing() -> None:
    stale = claim_of("job", owner="old")
    stale.progress(0.5, "half")
    expire(stale)
    fresh = claim_of("job", owner="new")
    # A takeover starts over without clearing: the old attempt's figure stays, marked as such.
    assert progress_text(Task.objects.get(key="job")) == "50% half (token 1) earlier attempt"
    before = Task.objects.values().get(key="job")
    with pytest.raises(StaleClaim) as info:
        stale.progress(0.9, "old writer")
    assert (info.value.token, info.value.action) == (1, "progress")
    assert Task.objects.values().get(key="job") == before
    assert Attempt.objects.get(token=1).stale_writes == 1
    fresh.progress(0.1, "new writer")
    assert stored("job") == (0.1, "new writer", 2)


def test_progress_after_the_task_ended_is_refused() -> None:
    claim = claim_of("job")
    claim.progress(0.75)
    claim.complete("done")
    with pytest.raises(StaleClaim):
        claim.progress(0.8)
    assert stored("job") == (0.75, "", 1)


def test_progress_inside_fenced_commits_with_the_block() -> None:
    claim = claim_of("job")
    with pytest.raises(RuntimeError), claim.fenced():
        claim.progress(0.5, "in the block")
        raise RuntimeError("rolled back")
    assert stored("job") == (None, None, None)
    with claim.fenced():
        claim.progress(0.6, "committed")
    assert stored("job") == (0.6, "committed", 1)


@pytest.mark.parametrize(("fraction", "note", "named"), [
    (math.nan, "", "NaN"), (-0.01, "", "outside [0, 1]"), (1.0001, "", "outside [0, 1]"),
    (math.inf, "", "outside [0, 1]"), ("0.5", "", "not str"), (True, "", "not bool"), (None, "", "not NoneType"),
    (0.5, "x" * 256, "256 characters long; the limit is 255"), (0.5, "a\x00b", "NUL character"),
    (0.5, "\ud800", "lone surrogate"), (0.5, 7, "must be a string"),
])
def test_bad_progress_is_refused_naming_the_problem_and_writes_nothing(fraction: object, note: object,
                                                                       named: str) -> None:
    claim = claim_of("job")
    claim.progress(0.3, "kept")
    with pytest.raises(InvalidArgument) as info:
        claim.progress(fraction, note)  # type: ignore[arg-type]
    assert named in str(info.value)
    assert stored("job") == (0.3, "kept", 1)
    claim.complete()  # the claim is still held


def test_aprogress_writes_and_is_fenced() -> None:
    async def main() -> None:
        try:
            outcome = await Task.objects.aclaim("job", owner="old", lease=30)
            stale = outcome.claim
            await stale.aprogress(0.4, "async")
            assert await sync_to_async(stored)("job") == (0.4, "async", 1)
            await sync_to_async(expire)(stale)
            await Task.objects.aclaim("job", owner="new", lease=30)
            with pytest.raises(StaleClaim):
                await stale.aprogress(0.9)
            assert await sync_to_async(stored)("job") == (0.4, "async", 1)
        finally:
            await sync_to_async(connections.close_all)()

    asyncio.run(main())


def test_taskclaim_inspect_shows_progress_as_text_and_json() -> None:
    claim = claim_of("job")
    claim.progress(0.42, "step 3 of 7")
    out = io.StringIO()
    call_command("taskclaim_inspect", "job", stdout=out)
    assert "progress      42% step 3 of 7 (token 1)" in out.getvalue()
    out = io.StringIO()
    call_command("taskclaim_inspect", "job", "--json", stdout=out)
    found = json.loads(out.getvalue())["task"]
    assert (found["progress"], found["progress_note"], found["progress_token"]) == (0.42, "step 3 of 7", 1)


# As tests/core/test_properties.py: TASKCLAIM_HYPOTHESIS_EXAMPLES examples, no deadline (a loaded
# machine), derandomized in CI.
@settings(max_examples=int(os.environ.get("TASKCLAIM_HYPOTHESIS_EXAMPLES", "100")), deadline=None,
          derandomize=bool(os.environ.get("CI")))
@given(fraction=st.one_of(st.floats(), st.integers(-3, 3), st.booleans(), st.none(), st.text(max_size=3)),
       note=st.one_of(st.text(max_size=300), st.sampled_from(["", "\x00", "\udfff", "x" * 255]), st.integers()))
def test_any_progress_is_stored_exactly_or_refused_with_nothing_written(fraction: object, note: object) -> None:
    Task.objects.filter(key="prop").delete()
    claim = claim_of("prop")
    try:
        claim.progress(fraction, note)  # type: ignore[arg-type]
    except InvalidArgument:
        assert stored("prop") == (None, None, None)
        return
    assert isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0 <= fraction <= 1
    assert stored("prop") == (float(fraction), note, 1)
