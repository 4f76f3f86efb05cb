"""The stores' statements: each written once, readable as SQL where it lives (issue 31 item 2)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

STORE = Path(__file__).resolve().parents[2] / "django_taskclaim" / "store"


def methods(module: str) -> dict[str, set[str]]:
    """Each class of ``store/<module>.py`` and the methods it defines."""
    tree = ast.parse((STORE / f"{module}.py").read_text())
    return {node.name: {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
            for node in tree.body if isinstance(node, ast.ClassDef)}


def test_complete_and_claim_next_is_written_once_for_the_vendors_that_share_it() -> None:
    """The portable store's ``complete_and_claim_next`` (a completion, then the queue claim, in the
    lifecycle's one transaction) serves SQLite and MySQL alike; only PostgreSQL, whose one fused
    statement differs, writes its own. MySQL had a copy that differed only by excluding the task it
    completed from the claim, which the portable claim now does for every vendor."""
    defined = {module: [cls for cls, names in methods(module).items() if "complete_and_claim_next" in names]
               for module in ("sql", "sqlite", "mysql", "postgresql")}
    assert defined == {"sql": ["SQLStore"], "sqlite": [], "mysql": [], "postgresql": ["PostgreSQLStore"]}, defined


QUERIES = STORE / "queries"
MODULES = {"sql": None, "postgresql": "postgresql", "mysql": "mysql", "sqlite": "sqlite"}


def names_used(module: str) -> set[str]:
    """The statements ``store/<module>.py`` asks for by name (``self.sql("name")``)."""
    tree = ast.parse((STORE / f"{module}.py").read_text())
    return {node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sql"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)}


def test_every_statement_named_in_the_code_is_in_the_files_and_every_one_in_the_files_is_used() -> None:
    """A name the portable store asks for is in common.sql (every vendor can run it), a vendor
    module's in what that vendor runs; and no file holds a statement that no store asks for."""
    from django_taskclaim.store.queries import FILES, STATEMENTS

    used = {module: names_used(module) for module in MODULES}
    assert used["sql"] <= set(FILES["common"]), used["sql"] - set(FILES["common"])
    for module, vendor in MODULES.items():
        if vendor is not None:
            assert used[module] <= set(STATEMENTS[vendor]), (module, used[module] - set(STATEMENTS[vendor]))
    everywhere = set().union(*used.values())
    for stem, statements in FILES.items():
        # A vendor's statement is used by its module, or overrides one the portable store asks for.
        mine = used["sql"] | (used.get(stem) or set()) if stem != "common" else everywhere
        assert set(statements) <= mine, (stem, set(statements) - mine)


def test_no_statement_is_written_twice() -> None:
    """No two names, in one file or across files, hold the same SQL: a vendor's file holds a
    statement only where its SQL differs from common.sql's."""
    from django_taskclaim.store.queries import FILES

    seen: dict[str, str] = {}
    for stem, statements in FILES.items():
        for name, text in statements.items():
            where = f"{stem}.sql: {name}"
            assert text not in seen, f"{where} repeats {seen[text]}"
            seen[text] = where


def test_the_files_are_the_ones_the_loader_reads_and_ship_in_the_package_data() -> None:
    import tomllib

    from django_taskclaim.store import VENDORS
    from django_taskclaim.store.queries import COMMON, VENDOR_FILES

    assert {p.stem for p in QUERIES.glob("*.sql")} == {COMMON, *VENDOR_FILES}
    assert set(VENDOR_FILES) == set(VENDORS), "a file of statements per store in store.VENDORS"
    with (STORE.parents[1] / "pyproject.toml").open("rb") as f:
        data = tomllib.load(f)["tool"]["setuptools"]["package-data"]["django_taskclaim"]
    assert "store/queries/*.sql" in data, data


@pytest.mark.parametrize(("text", "problem"), [
    ("SELECT 1\n-- name: x\nSELECT 2", "file.sql:1: SQL before the first '-- name: ...' header"),
    ("-- name: x\nSELECT 1\n-- name: x\nSELECT 2", "file.sql:3: statement 'x' is named twice"),
    ("-- name: x\n-- only a comment\n-- name: y\nSELECT 1", "file.sql:1: statement 'x' has no SQL under its header"),
    ("-- name: Bad-Name\nSELECT 1", "file.sql:1: statement name 'Bad-Name' is not lower_snake_case"),
    ("-- name: x\nSELECT 1 -- one\nFROM t", "file.sql:2: a comment after SQL; put it on a line of its own"),
])
def test_the_loader_names_what_is_wrong_in_a_file(text: str, problem: str) -> None:
    from django_taskclaim.store.queries import parse

    with pytest.raises(ValueError, match=re.escape(problem)):
        parse(text, "file.sql")


def test_the_loader_reads_a_statement_as_written() -> None:
    from django_taskclaim.store.queries import parse

    text = "-- name: two\n-- what it does\nSELECT 1\n  FROM t\n\n  -- why\nWHERE a = %s\n-- name: one\nSELECT 2"
    assert parse(text, "f.sql") == {"two": "SELECT 1 FROM t WHERE a = %s", "one": "SELECT 2"}
