"""The built wheel holds the app and nothing else: no development tooling, tests or example."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    out = tmp_path_factory.mktemp("wheel")
    # From a copy of what the build reads (git's files, so nothing untracked): setuptools writes
    # build/ and *.egg-info beside the sources. No build isolation: the virtualenv's setuptools
    # builds it, with no download.
    source = out / "source"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    for name in tracked.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(source)], check=True, cwd=out)
    [wheel] = out.glob("django_taskclaim-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_the_wheel_holds_only_the_app(wheel_files: list[str]) -> None:
    tops = {name.split("/", 1)[0] for name in wheel_files}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"django_taskclaim"}, tops
    for name in wheel_files:
        assert "/testing/" not in name and not name.startswith(("devtools/", "tests/", "example_project/")), name


def test_the_wheel_holds_what_the_app_needs(wheel_files: list[str]) -> None:
    names = set(wheel_files)
    assert "django_taskclaim/py.typed" in names
    assert "django_taskclaim/migrations/0001_initial.py" in names
    assert "django_taskclaim/management/commands/taskclaim_worker.py" in names
    assert "django_taskclaim/management/commands/taskclaim_reclaim.py" in names
    assert "django_taskclaim/management/commands/reclaim.py" in names  # the design's name of taskclaim_reclaim
    assert "django_taskclaim/templates/admin/django_taskclaim/task/queues.html" in names  # the admin's pages
    assert any(n.startswith("django_taskclaim/store/") for n in names)
    assert any(n.startswith("django_taskclaim/contrib/celery/") for n in names)


def test_the_wheel_holds_the_stores_statement_files(wheel_files: list[str]) -> None:
    """The stores read their statements from store/queries/*.sql at import: without them in the
    wheel an installed app cannot start."""
    shipped = {name for name in wheel_files if name.startswith("django_taskclaim/store/queries/")}
    folder = ROOT / "django_taskclaim" / "store" / "queries"
    expected = {f"django_taskclaim/store/queries/{p.name}" for p in folder.glob("*.sql")}
    assert expected and expected <= shipped, expected - shipped
