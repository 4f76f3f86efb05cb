"""The virtualenv of a source checkout: ``python3 -m tests``, the demo and the benchmarks re-run
themselves inside ``.venv`` (created and filled on first use), so that a fresh clone needs
only the system ``python3``. Standard library only: it runs before anything is installed."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
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
