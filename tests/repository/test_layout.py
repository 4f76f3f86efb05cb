"""The test rooms hold what tests/README.md says they hold: ``core/`` tests the claim API in one
process, and a test that starts OS processes (a racer, a fork) lives in ``processes/`` (or the
room of the integration it drives), where CI's time budget and the reader look for races."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

# Fixtures that start OS processes (tests/conftest.py), and names that start one directly.
PROCESS_FIXTURES = {"processes", "spawn"}
PROCESS_NAMES = {"Supervisor", "multiprocessing", "subprocess", "fork", "Popen"}

# Process tests still in core/, each with the reason it is still there (none now).
NOT_YET_MOVED: set[str] = set()


def _names(node: ast.AST) -> set[str]:
    """Every plain name and attribute name used inside ``node``."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


def _is_fixture(func: ast.FunctionDef) -> bool:
    return any("fixture" in _names(decorator) for decorator in func.decorator_list)


def process_tests(path: Path) -> list[str]:
    """The tests of one module that start OS processes: through a fixture that does (directly or
    through another fixture or helper of the module), or by naming a process API in their body."""
    tree = ast.parse(path.read_text(), str(path))
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    starters = set(PROCESS_FIXTURES)
    changed = True
    while changed:  # the module's fixtures and helpers that start processes, to a fixed point
        changed = False
        for name, func in functions.items():
            if name in starters:
                continue
            args = {a.arg for a in func.args.args}
            if args & starters or _names(func) & (PROCESS_NAMES | starters):
                starters.add(name)
                changed = True
    return [name for name, func in functions.items()
            if name.startswith("test_") and name in starters and not _is_fixture(func)]


def test_core_tests_run_in_one_process() -> None:
    found = {f"tests/core/{path.name}::{name}"
             for path in sorted((ROOT / "tests" / "core").glob("test_*.py"))
             for name in process_tests(path)}
    assert found - NOT_YET_MOVED == set(), (
        "these tests start OS processes; they belong in tests/processes/ (tests/README.md)")


def test_the_detector_finds_a_process_test(tmp_path: Path) -> None:
    """The check above can fail: it sees a fixture, a helper and a direct process API."""
    module = tmp_path / "test_sample.py"
    module.write_text(
        "import multiprocessing\n"
        "def _wave(processes): return processes.start('x')\n"
        "def test_by_fixture(spawn): spawn('race')\n"
        "def test_by_helper(processes): _wave(processes)\n"
        "def test_by_fork(): multiprocessing.get_context('fork').Process(target=print)\n"
        "def test_in_process(db): assert db\n")
    assert sorted(process_tests(module)) == ["test_by_fixture", "test_by_fork", "test_by_helper"]
