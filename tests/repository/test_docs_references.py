"""The docs name the tests that prove each guarantee: every test they cite must exist, so that a
renamed or moved test cannot leave a guarantee pointing at nothing."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT

# `tests/x/test_y.py::test_name`, or `::test_name` after a path (the same file), in backquotes.
CITED = re.compile(r"`(tests/[\w/]+\.py)?(::)?([A-Za-z_][\w*]*)?[^`]*`")


def cited_tests(text: str) -> list[tuple[str, str | None]]:
    """``(path, test name or None)`` for each test a page cites, a bare ``::name`` read in the file
    cited last before it."""
    found: list[tuple[str, str | None]] = []
    path = None
    for match in CITED.finditer(text):
        named, sep, name = match.groups()
        if named:
            path = named
        if path is None or not (named or sep):
            continue
        found.append((path, name if sep and name and name.startswith("test_") else None))
    return found


def test_the_reader_finds_paths_and_names() -> None:
    text = "`tests/a/test_b.py::test_c[x]`, `::test_d`, `tests/e/test_f.py` and `::test_g_*`"
    assert cited_tests(text) == [("tests/a/test_b.py", "test_c"), ("tests/a/test_b.py", "test_d"),
                                 ("tests/e/test_f.py", None), ("tests/e/test_f.py", "test_g_*")]


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_every_cited_test_exists(page: str) -> None:
    missing = []
    for path, name in cited_tests((ROOT / "docs" / page).read_text()):
        source = ROOT / path
        if not source.exists():
            missing.append(path)
        elif name is not None:
            # A name ending in "*" stands for every test it begins (``test_e010_*``).
            pattern = re.escape(name.rstrip("*")) + (r"\w*" if name.endswith("*") else "")
            if not re.search(rf"^(async )?def {pattern}\(", source.read_text(), re.M):
                missing.append(f"{path}::{name}")
    assert not missing, f"docs/{page} cites tests that do not exist: {missing}"
