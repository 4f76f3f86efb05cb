"""``Backoff.delay``: the wait before a failed queued task may run again. Exact values with no
jitter, the cap, and the jitter's bounds (issue 30, item 14: an exponent off by one and a
cap removed passed every other test)."""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_taskclaim.exceptions import InvalidArgument
from django_taskclaim.retries import Backoff

EXAMPLES = int(os.environ.get("TASKCLAIM_HYPOTHESIS_EXAMPLES", "100"))


@pytest.fixture
def draw(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Fix what ``random.random()`` returns to ``Backoff.delay`` (the jitter's draw)."""

    def fix(value: float) -> None:
        monkeypatch.setattr("django_taskclaim.retries.random.random", lambda: value)

    return fix


def test_without_jitter_attempt_n_waits_base_times_factor_to_the_n_minus_1() -> None:
    backoff = Backoff(base=1.5, factor=3, cap=1000, jitter=0)
    assert [backoff.delay(n) for n in range(1, 7)] == [1.5, 4.5, 13.5, 40.5, 121.5, 364.5]
    assert Backoff(base=2, factor=1, jitter=0).delay(40) == 2  # factor 1: a constant wait


def test_the_cap_bounds_every_wait_even_where_the_power_would_overflow() -> None:
    backoff = Backoff(base=1, factor=2, cap=10, jitter=0)
    assert [backoff.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert backoff.delay(1025) == 10 and backoff.delay(10**6) == 10
    assert Backoff(jitter=0).delay(1025) == 300 == Backoff(jitter=0).delay(10**6)  # 2.0 ** 1024 overflows
    assert Backoff(base=50, cap=20, jitter=0).delay(1) == 20  # a base above the cap: the cap
    assert Backoff(base=0, jitter=0).delay(9) == 0  # no wait at all


def test_an_attempt_below_one_waits_the_base() -> None:
    assert Backoff(base=3, jitter=0).delay(0) == 3 == Backoff(base=3, jitter=0).delay(-2)


def test_the_default_waits_half_to_all_of_one_two_four_seconds_up_to_300(draw) -> None:  # type: ignore[no-untyped-def]
    """As documented: about 0.5–1 s, 1–2 s, 2–4 s… up to 150–300 s."""
    draw(0.0)  # no jitter drawn: the full wait
    assert [Backoff().delay(n) for n in (1, 2, 3, 9, 10, 50)] == [1, 2, 4, 256, 300, 300]
    draw(1.0)  # the most jitter: half of it (random() is below 1; its limit)
    assert [Backoff().delay(n) for n in (1, 2, 3, 9, 10, 50)] == [0.5, 1, 2, 128, 150, 150]


def test_the_jitter_takes_its_fraction_off_the_end_of_the_wait(draw) -> None:  # type: ignore[no-untyped-def]
    backoff = Backoff(base=10, factor=2, cap=100, jitter=0.25)
    draw(0.5)
    assert backoff.delay(1) == 10 * (1 - 0.25 * 0.5) and backoff.delay(5) == 100 * (1 - 0.25 * 0.5)
    draw(0.0)
    assert backoff.delay(2) == 20


def test_tasks_that_failed_together_do_not_all_come_back_together() -> None:
    """The jitter is drawn afresh for each wait (not one draw for all, not none)."""
    waits = {Backoff(base=100, jitter=0.5).delay(1) for _ in range(50)}
    assert len(waits) > 40 and all(50 <= wait <= 100 for wait in waits)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=bool(os.environ.get("CI")))
@given(base=st.floats(0, 1e4), factor=st.floats(1, 10), cap=st.floats(0, 1e6), jitter=st.floats(0, 1),
       attempt=st.integers(1, 60), drawn=st.floats(0, 1, exclude_max=True))
def test_every_wait_lies_in_the_jitter_band_below_the_capped_exponential(
    base: float, factor: float, cap: float, jitter: float, attempt: int, drawn: float,
) -> None:
    from unittest import mock

    full = min(cap, base * factor ** (attempt - 1))
    with mock.patch("django_taskclaim.retries.random.random", return_value=drawn):
        wait = Backoff(base=base, factor=factor, cap=cap, jitter=jitter).delay(attempt)
    assert math.isclose(wait, full * (1 - jitter * drawn), rel_tol=1e-9, abs_tol=1e-12)
    assert full * (1 - jitter) - 1e-9 <= wait <= full <= cap


@pytest.mark.parametrize(("fields", "problem"), [
    ({"base": -1}, "must not be negative"), ({"cap": -0.5}, "must not be negative"),
    ({"factor": 0.5}, "factor must be 1 or more"), ({"jitter": 1.5}, "jitter must be between 0 and 1"),
    ({"jitter": -0.1}, "jitter must be between 0 and 1"), ({"base": float("nan")}, "base must be a finite number"),
    ({"cap": float("inf")}, "cap must be a finite number"), ({"factor": True}, "factor must be a finite number"),
    ({"base": "1"}, "base must be a finite number"),
])
def test_a_bad_backoff_names_its_field(fields: dict[str, object], problem: str) -> None:
    with pytest.raises(InvalidArgument, match=problem):
        Backoff(**fields)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=problem):
        Backoff.of(fields, "OPTIONS['BACKOFF']")


def test_of_takes_a_backoff_or_a_dict_of_its_fields_and_names_what_is_wrong() -> None:
    same = Backoff(base=2)
    assert Backoff.of(same) is same and Backoff.of({"base": 2, "jitter": 0}) == Backoff(base=2, jitter=0)
    with pytest.raises(InvalidArgument, match=r"OPTIONS\['BACKOFF'\] has unknown key\(s\) \['bse'\]"):
        Backoff.of({"bse": 2}, "OPTIONS['BACKOFF']")
    with pytest.raises(InvalidArgument, match="must be a Backoff or a dict of its fields, not int"):
        Backoff.of(5)
