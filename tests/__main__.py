"""The test command: ``python3 -m tests`` from a clone.

It creates ``.venv`` (first run, or when ``pyproject.toml`` changed) with the app and its test
dependencies, then runs pytest on SQLite and on PostgreSQL. Without ``PGHOST`` in the
environment it starts a throwaway PostgreSQL server on 127.0.0.1 for the run.

    python3 -m tests                      # both databases
    python3 -m tests --db sqlite -k claim # one database, pytest options after
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"


def venv_python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv(extras: str = "dev") -> None:
    """Re-run this module inside ``.venv``, creating and filling it first if needed."""
    if Path(sys.prefix).resolve() == VENV.resolve() or os.environ.get("TASKCLAIM_NO_VENV"):
        return
    if not venv_python().exists():
        print(f"creating {VENV} ...", flush=True)
        venv.create(VENV, with_pip=True)
    stamp = VENV / f".installed-{extras}"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if not stamp.exists() or stamp.read_text() != digest:
        print(f"installing django-taskclaim[{extras}] into {VENV} ...", flush=True)
        subprocess.run([str(venv_python()), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        subprocess.run([str(venv_python()), "-m", "pip", "install", "-q", "-e", f"{ROOT}[{extras}]"], check=True)
        stamp.write_text(digest)
    os.execv(str(venv_python()), [str(venv_python()), *sys.orig_argv[1:]])


def run_pytest(db: str, pytest_args: list[str]) -> int:
    from tests.servers import PostgresServer

    env = dict(os.environ, TASKCLAIM_TEST_DB=db, PYTHONPATH=str(ROOT))
    # A file of its own per run, so that two runs on one machine never share a database.
    sqlite_file = os.path.join(tempfile.gettempdir(), f"taskclaim-tests-{os.getpid()}.sqlite3")
    env.setdefault("TASKCLAIM_TEST_SQLITE", sqlite_file)
    server = None
    if db == "postgresql" and "PGHOST" not in os.environ:
        server = PostgresServer().start()
        env.update(server.env)
        print(f"started PostgreSQL on 127.0.0.1:{server.port}", flush=True)
    try:
        print(f"\n===== tests on {db} =====", flush=True)
        return subprocess.call([sys.executable, "-m", "pytest", *pytest_args], cwd=ROOT, env=env)
    finally:
        if server is not None:
            server.stop()


def main() -> int:
    ensure_venv()
    parser = argparse.ArgumentParser(prog="python3 -m tests", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=("sqlite", "postgresql", "all"), default="all",
                        help="database(s) to run the suite on (default: %(default)s)")
    args, pytest_args = parser.parse_known_args()
    sys.path.insert(0, str(ROOT))
    dbs = ["sqlite", "postgresql"] if args.db == "all" else [args.db]
    results = {db: run_pytest(db, pytest_args) for db in dbs}
    print("\n" + "  ".join(f"{db}: {'ok' if code == 0 else f'FAILED (exit {code})'}" for db, code in results.items()))
    return 0 if all(code == 0 for code in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
