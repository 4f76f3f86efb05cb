"""The registries are the only lists: a database is a store module plus its line in
``store.VENDORS``, an integration its folder (or module) plus its line in ``contrib.INTEGRATIONS``."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from django.core import checks as django_checks
from django.utils.module_loading import import_string

from django_taskclaim import contrib, store
from django_taskclaim.store.sql import SQLStore

PACKAGE = Path(store.__file__).resolve().parent.parent
# Asking which database a connection is: only the store does that (and the migrations, which
# run once per vendor's schema).
VENDOR_QUESTION = re.compile(r"\.vendor\b|mysql_is_mariadb|\"(postgresql|sqlite|mysql)\"")


def test_every_store_module_is_in_vendors_and_vendors_holds_nothing_else() -> None:
    stores = {}
    for path in sorted((PACKAGE / "store").glob("*.py")):
        name = "django_taskclaim.store" if path.stem == "__init__" else f"django_taskclaim.store.{path.stem}"
        module = importlib.import_module(name)
        found = getattr(module, "store", None)
        if isinstance(found, SQLStore):
            stores[found.vendor] = found
    assert stores and stores == store.VENDORS


def test_nothing_outside_the_store_names_a_database() -> None:
    askers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in ("store", "migrations"):
            continue
        askers += [f"{relative}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
                   if VENDOR_QUESTION.search(line)]
    assert not askers, askers


def test_every_integration_is_in_the_registry_and_its_check_is_registered() -> None:
    under_contrib = {p.stem for p in (PACKAGE / "contrib").iterdir()
                     if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").exists())}
    assert under_contrib == set(contrib.INTEGRATIONS)
    registered = django_checks.registry.registry.get_checks()
    for name, path in contrib.INTEGRATIONS.items():
        if path is not None:
            assert path.startswith(f"django_taskclaim.contrib.{name}.")
            assert import_string(path) in registered, path


def test_no_core_module_names_an_integration() -> None:
    """The app's checks and start-up reach integrations through the registry only."""
    for name in ("checks.py", "apps.py", "checkspec.py"):
        text = (PACKAGE / name).read_text()
        assert not any(integration in text for integration in contrib.INTEGRATIONS), name
