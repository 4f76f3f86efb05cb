"""The stores' statements: each written once, readable as SQL where it lives (issue 31 item 2)."""

from __future__ import annotations

import ast
from pathlib import Path

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
