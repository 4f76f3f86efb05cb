"""The registries are the only lists: a database is a store module plus its line in
``store.VENDORS``, an integration its folder (or module) plus its line in ``contrib.INTEGRATIONS``,
a worker's runner without a handler a line in ``worker_runners.WORKER_RUNNERS``."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from django.core import checks as django_checks
from django.utils.module_loading import import_string

from django_taskclaim import contrib, store, worker_runners
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
        # downstream/ is the app a *receiving* service installs without the task tables, and so
        # without the store: its one question (SQLite's write lock first) is its own.
        if relative.parts[0] in ("store", "migrations") or relative.parts[:2] == ("downstream", "rows.py"):
            continue
        askers += [f"{relative}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
                   if VENDOR_QUESTION.search(line)]
    assert not askers, askers


def test_every_integration_is_in_the_registry_and_its_check_is_registered() -> None:
    under_contrib = {p.stem for p in (PACKAGE / "contrib").iterdir()
                     if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").exists())}
    assert under_contrib == set(contrib.INTEGRATIONS)
    registered = django_checks.registry.registry.get_checks()
    for name, integration in contrib.INTEGRATIONS.items():
        if integration.check is not None:
            assert integration.check.startswith(f"django_taskclaim.contrib.{name}.")
            assert import_string(integration.check) in registered, integration.check
        if integration.delivery_link is not None:  # in its own folder, and what the admin calls
            assert integration.delivery_link.startswith(f"django_taskclaim.contrib.{name}.")
            link = import_string(integration.delivery_link)
            assert callable(link.annotate) and callable(link.url)


def test_every_worker_runner_is_a_factory_in_its_plugins_folder() -> None:
    assert worker_runners.DEFAULT in worker_runners.WORKER_RUNNERS
    for path in worker_runners.WORKER_RUNNERS.values():
        assert path.startswith(("django_taskclaim.contrib.", "django_taskclaim.tasks.")), path
        module, _, name = path.rpartition(".")
        assert f"def {name}(" in (PACKAGE.parent / (module.replace(".", "/") + ".py")).read_text(), path


def test_the_worker_command_names_no_plugin() -> None:
    """``taskclaim_worker`` without a handler asks the registry, not a branch of its own."""
    text = (PACKAGE / "management" / "commands" / "taskclaim_worker.py").read_text()
    assert "django_taskclaim.tasks" not in text and "TaskRunner" not in text


def test_no_core_module_names_an_integration() -> None:
    """The app's checks, start-up and admin reach integrations through the registry only."""
    for name in ("checks.py", "apps.py", "checkspec.py", "admin.py"):
        text = (PACKAGE / name).read_text()
        assert not any(integration in text for integration in contrib.INTEGRATIONS), name
