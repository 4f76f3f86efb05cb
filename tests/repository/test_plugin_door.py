"""The plug-ins (the Celery bridge, LangGraph nodes, the Django Tasks backend) reach the core
through its public door only: ``django_taskclaim.execution``, the claim API, the models and
the ground modules. None imports ``django_taskclaim.lifecycle…`` or ``django_taskclaim.store…``
(absolute or relative, type-only imports too), nor uses a core name that starts with an
underscore (imported, or as an attribute such as a claim's private methods).

Read from the source with ``ast``: nothing is imported, so the test needs no optional extra.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "django_taskclaim"
FORBIDDEN = ("django_taskclaim.lifecycle", "django_taskclaim.store")


def plugin_files() -> list[Path]:
    return sorted([*(PACKAGE / "contrib").rglob("*.py"), PACKAGE / "celery.py", *(PACKAGE / "tasks").rglob("*.py")])


def core_files() -> list[Path]:
    plugins = set(plugin_files())
    return sorted(p for p in PACKAGE.rglob("*.py") if p not in plugins and "migrations" not in p.parts)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def absolute(path: Path, node: ast.ImportFrom) -> str:
    """The module an ``ImportFrom`` in ``path`` names, its relative form resolved."""
    if not node.level:
        return node.module or ""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined_private_names(paths: list[Path]) -> set[str]:
    """Underscore names these modules define: functions, classes, module and instance attributes."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign) else [])
            for target in targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif isinstance(target, ast.Attribute):
                    names.add(target.attr)
    return {n for n in names if private(n)}


def trespasses(path: Path, source: str, core_private: set[str], plugin_modules: set[str]) -> Iterator[str]:
    """Each import or attribute of ``source`` (the text of plug-in module ``path``) past the door."""
    where = path.relative_to(ROOT)
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(FORBIDDEN):
                    yield f"{where}:{node.lineno}: import {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            module = absolute(path, node)
            for alias in node.names:
                full = f"{module}.{alias.name}"
                if module.startswith(FORBIDDEN) or full.startswith(FORBIDDEN):
                    yield f"{where}:{node.lineno}: from {module} import {alias.name}"
                elif (private(alias.name) and module.startswith("django_taskclaim")
                      and module not in plugin_modules):
                    yield f"{where}:{node.lineno}: from {module} import {alias.name} (a private name of the core)"
        elif isinstance(node, ast.Attribute) and node.attr in core_private:
            yield f"{where}:{node.lineno}: .{node.attr} (a private name of the core)"


def test_plugins_reach_the_core_only_through_its_public_door() -> None:
    plugins = plugin_files()
    assert PACKAGE / "contrib" / "langgraph.py" in plugins and PACKAGE / "tasks" / "runner.py" in plugins
    core_private = defined_private_names(core_files()) - defined_private_names(plugins)
    modules = {module_name(p) for p in plugins}
    found = [line for path in plugins for line in trespasses(path, path.read_text(), core_private, modules)]
    assert not found, "plug-ins past the public door:\n" + "\n".join(found)


def test_the_door_sees_every_form_of_a_forbidden_import() -> None:
    """The checker itself: each form below, in a module of the Celery bridge's folder, is reported."""
    source = (
        "import django_taskclaim.store.rows\n"
        "from django_taskclaim.lifecycle.execution import execute\n"
        "from ...lifecycle import Claim\n"
        "from ... import store\n"
        "from ...identity import _private\n"
        "from .options import _own\n"  # the plug-in's own private name: allowed
        "claim._core_only()\n"
    )
    probe = PACKAGE / "contrib" / "celery" / "probe.py"
    lines = list(trespasses(probe, source, {"_core_only"}, {"django_taskclaim.contrib.celery.options"}))
    assert [line.split(":")[1] for line in lines] == ["1", "2", "3", "4", "5", "7"], lines


def test_plugins_record_failures_through_the_one_rule() -> None:
    """A plug-in never calls ``claim.fail()`` itself: a failure (Celery's ``self.retry()`` and
    autoretry too) is recorded by the execution module's rule (``conclude``, ``record_failure``),
    the code that records every other failure: the attempt, its error and the task's status."""
    found = [f"{path.relative_to(ROOT)}:{node.lineno}: .{node.func.attr}()"
             for path in plugin_files() for node in ast.walk(ast.parse(path.read_text(), str(path)))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and node.func.attr in ("fail", "afail")]
    assert not found, "failures recorded beside the one rule:\n" + "\n".join(found)
