"""The documented options are the real ones: every option of each command appears where its
documentation is, and ``work()``'s documented signature names every parameter it takes. An
option added without its documentation fails here, naming the page and the option."""

from __future__ import annotations

import ast
import inspect
import re

import pytest
from django.core.management import load_command_class
from django.core.management.base import BaseCommand

from django_taskclaim.worker import work
from tests.conftest import ROOT

DOCS = ROOT / "docs"
#: Each command, and where its options are documented: (page, the heading its section starts at).
SECTIONS = {
    "taskclaim_worker": [("reference.md", "`taskclaim_worker [HANDLER]"),
                         ("django-tasks.md", "## Running workers")],
    "taskclaim_reclaim": [("operations.md", "### `taskclaim_reclaim`")],
    "taskclaim_inspect": [("operations.md", "### `taskclaim_inspect`")],
    "taskclaim_audit": [("operations.md", "### `taskclaim_audit`")],
    "taskclaim_purge": [("operations.md", "### `taskclaim_purge`")],
    "taskclaim_epoch": [("operations.md", "### `taskclaim_epoch`")],
    "taskclaim_scheduler": [("operations.md", "### `taskclaim_scheduler`")],
    "taskclaim_relay": [("outbox.md", "## The relay: `manage.py taskclaim_relay`")],
}


def own_options(name: str) -> set[str]:
    """The command's long options, without those every Django command has (``--settings``…)."""
    def longs(parser) -> set[str]:  # type: ignore[no-untyped-def]
        return {s for action in parser._actions for s in action.option_strings if s.startswith("--")}

    command = load_command_class("django_taskclaim", name)
    return longs(command.create_parser("manage.py", name)) - longs(BaseCommand().create_parser("manage.py", "x"))


def section(page: str, start: str) -> str:
    """The text of ``page`` from ``start`` to the next heading (of any level)."""
    text = (DOCS / page).read_text()
    at = text.index(start)
    following = re.search(r"^#{1,6} ", text[at + len(start):], re.MULTILINE)
    return text[at: at + len(start) + following.start()] if following else text[at:]


@pytest.mark.parametrize(("command", "page", "start"),
                         [(c, page, start) for c, where in SECTIONS.items() for page, start in where])
def test_every_option_of_a_command_is_documented(command: str, page: str, start: str) -> None:
    found = re.findall(r"(--[a-z][a-z-]*)(=[a-z]+)?", section(page, start))  # --until-drained=due: an option too
    documented = {name for name, _ in found} | {name + value for name, value in found if value}
    missing = sorted(own_options(command) - documented)
    assert not missing, f"docs/{page} ({start}) does not document {command}'s {', '.join(missing)}"


def test_the_worker_options_table_of_django_tasks_lists_each_option_in_a_row() -> None:
    rows = set(re.findall(r"^\| `(--[a-z][a-z-]*(?:=[a-z]+)?)", section("django-tasks.md", "## Running workers"),
                          re.MULTILINE))
    assert own_options("taskclaim_worker") <= rows, sorted(own_options("taskclaim_worker") - rows)


def test_works_documented_signature_is_its_signature() -> None:
    text = (DOCS / "reference.md").read_text()
    [documented] = re.findall(r"^`(work\(handler, \*,[^`]*\) -> WorkerStats)`", text, re.MULTILINE | re.DOTALL)
    pairs = re.findall(r"(\w+)=([^,)]+)", documented)
    real = [p for p in inspect.signature(work).parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert [n for n, _ in pairs] == [p.name for p in real], (
        f"reference.md documents work({', '.join(n for n, _ in pairs)}); it takes {', '.join(p.name for p in real)}")
    for (name, default), p in zip(pairs, real, strict=True):
        assert ast.literal_eval(default) == p.default, f"work()'s {name} defaults to {p.default!r}, not {default}"


def test_every_setting_has_a_row_in_the_settings_table() -> None:
    from django_taskclaim.conf import TaskClaimSettings

    names = {n for n, v in vars(TaskClaimSettings).items() if isinstance(v, property) and n.isupper()}
    rows = set(re.findall(r"^\| `TASKCLAIM_([A-Z_]+)`", section("reference.md", "## Settings"), re.MULTILINE))
    assert names <= rows, f"reference.md's settings table lacks TASKCLAIM_{', TASKCLAIM_'.join(sorted(names - rows))}"
