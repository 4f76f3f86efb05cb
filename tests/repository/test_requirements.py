"""A missing server, browser or library is a skip on a laptop and a failure in CI."""

from __future__ import annotations

import pytest
from _pytest.outcomes import Failed, Skipped

from tests.conftest import require_module, requirement_missing


def test_missing_requirement_fails_in_ci(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CI", "true")
    with pytest.raises(Failed, match="redis-server is required in CI"):
        requirement_missing("redis-server")
    with pytest.raises(Failed, match="no-such-module is required in CI"):
        require_module("tests.no_such_module", "no-such-module")


def test_missing_requirement_skips_outside_ci(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(Skipped, match="chromium is not installed"):
        requirement_missing("chromium")
    with pytest.raises(Skipped, match="no-such-module is not installed"):
        require_module("tests.no_such_module", "no-such-module")
    require_module("json", "json")  # present: nothing happens
