"""One name per concept (issue 31): modules named for what they hold, one public import path for
the claim API beside the manager (``django_taskclaim.claims``), no shims of the unreleased 0.1.0.

Read from the source with ``ast`` and regular expressions: nothing of the package is imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "django_taskclaim"
#: Where users learn the import paths: the tests, the example, the benchmarks, the docs.
READERS = ("tests", "example_project", "benchmarks", "devtools")


def defined(path: Path) -> set[str]:
    """The top-level names a module defines (functions, classes, assignments)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def claim_api() -> set[str]:
    """The names ``django_taskclaim.claims`` hands on (its ``__all__``)."""
    tree = ast.parse((PACKAGE / "claims.py").read_text())
    [names] = [ast.literal_eval(n.value) for n in tree.body
               if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets)]
    return set(names)


def test_the_claim_lives_in_lifecycle_claim() -> None:
    assert not (PACKAGE / "lifecycle" / "handle.py").exists()
    assert "Claim" in defined(PACKAGE / "lifecycle" / "claim.py")


def test_lifecycle_package_hands_on_nothing() -> None:
    """``lifecycle`` is internal: its ``__init__`` re-exports nothing, so no second path to ``Claim``."""
    tree = ast.parse((PACKAGE / "lifecycle" / "__init__.py").read_text())
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)
               and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
    assert imports == []


def imports_of_claim_api(text: str, path: str) -> list[str]:
    """Each ``from django_taskclaim.X import name`` of a claim API name where X is not ``claims``."""
    api = claim_api()
    found = []
    for match in re.finditer(r"from (django_taskclaim[\w.]*) import (?:\(([\w, \n]+)\)|([\w, ]+))", text):
        module, names = match[1], {n.strip() for n in (match[2] or match[3]).replace("\n", ",").split(",")}
        if module not in ("django_taskclaim.claims", "django_taskclaim.models") and names & api:
            found.append(f"{path}: from {module} import {', '.join(sorted(names & api))}")
    return found


def test_one_import_path_for_the_claim_api() -> None:
    """The tests, example, benchmarks and docs import the claim API from ``django_taskclaim.claims``."""
    files = [p for d in READERS for p in (ROOT / d).rglob("*.py")]
    files += [*(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    found = [hit for p in files if p.name != "test_names.py"
             for hit in imports_of_claim_api(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == []


IDENTITY = {"TaskKey", "validate_key", "validate_tenant", "validate_owner", "resolve_identity", "MAX_KEY_LENGTH",
            "MAX_TENANT_LENGTH", "MAX_OWNER_LENGTH"}
VALUES = {"lease_seconds", "max_lease", "MIN_LEASE", "positive_int", "validate_text", "clean_text", "to_json",
          "canonical_json", "payload_json", "fingerprint", "json_encoder", "queue_names", "valid_priority"}


def test_identity_and_values_apart() -> None:
    """Who a task is (key, tenant, owner) and what a stored value may be are two modules."""
    assert not (PACKAGE / "keys.py").exists()
    identity, values = defined(PACKAGE / "identity.py"), defined(PACKAGE / "values.py")
    assert identity >= IDENTITY and not IDENTITY & values
    assert values >= VALUES and not VALUES & identity


@pytest.mark.parametrize("module", ["keys", "aio", "runner", "lifecycle/handle"])
def test_no_module_of_an_old_name(module: str) -> None:
    """The shims of the unreleased 0.1.0 are gone, and nothing names the old modules."""
    assert not (PACKAGE / f"{module}.py").exists()
    dotted = "django_taskclaim." + module.replace("/", ".")
    files = [p for d in ("django_taskclaim", *READERS) for p in (ROOT / d).rglob("*.py")]
    files += [*(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    naming = re.compile(rf"{re.escape(dotted)}\b")
    assert [str(p) for p in files if p.name != "test_names.py" and naming.search(p.read_text())] == []


#: Identifiers of a second word for a concept that has one (docs/concepts.md, "Glossary"): giving a
#: claim back is *release* (``Claim.release()``), a refused owner is *fenced off* (``FENCED_OFF``).
SECOND_WORDS = {"give_back", "given_back", "_give_back", "Fenced"}


def identifiers(tree: ast.AST) -> set[str]:
    """Every name a module defines or uses: names, attributes, arguments, keywords, definitions."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.arg | ast.keyword) and node.arg:
            found.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.alias):
            found.add(node.asname or node.name)
    return found


def test_one_word_per_concept_in_the_package() -> None:
    found = {f"{p.relative_to(ROOT)}: {name}" for p in PACKAGE.rglob("*.py")
             for name in identifiers(ast.parse(p.read_text(), str(p))) & SECOND_WORDS}
    assert sorted(found) == []


def test_the_glossary_names_each_concept_once() -> None:
    """docs/concepts.md's glossary: one row per concept, each with the public names carrying it."""
    text = (ROOT / "docs" / "concepts.md").read_text()
    glossary = text[text.index("## Glossary"):]
    concepts = re.findall(r"^\| ([^|]+?) \| \*\*([^*]+)\*\* \|", glossary, re.MULTILINE)
    words = [word for _, word in concepts]
    assert len(words) == len(set(words)) >= 10
    for concept, carriers in (("Fenced off", "`StaleClaim`"), ("Release", "`Claim.release()`"),
                              ("Runner", "`TaskRunner`"), ("Claim", "`django_taskclaim.claims`")):
        [row] = [line for line in glossary.splitlines() if line.startswith(f"| {concept} |")]
        assert carriers in row


def test_nothing_deprecated_before_the_first_release() -> None:
    """0.1.0 is unreleased: an old name is removed, not kept beside the new one with a warning."""
    found = [f"{p.relative_to(ROOT)}:{n}" for p in PACKAGE.rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"(?i)\bdeprecat", line)]
    assert found == []
