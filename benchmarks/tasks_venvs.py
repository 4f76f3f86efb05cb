"""The peers' own virtualenvs in the checkout (``.venv-bench311``, ``.venv-bench312``), made and
filled on first use, as ``devtools/venv.py`` makes ``.venv``: each peer runs at pinned versions
under the interpreter it needs (django-ox requires Python 3.12+), whatever the benchmark's own
environment holds."""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .tasks_systems import Venv

ROOT = Path(__file__).resolve().parent.parent


class Unavailable(Exception):
    """The peer cannot run on this machine; the message says why."""


def interpreter(want: str) -> str | None:
    """A Python ``want`` ("3.12") interpreter: ``TASKCLAIM_BENCH_PYTHON312`` if set, else pyenv's
    newest 3.12.x, else ``python3.12`` on the PATH."""
    override = os.environ.get(f"TASKCLAIM_BENCH_PYTHON{want.replace('.', '')}")
    if override:
        return override
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == want:
        return getattr(sys, "_base_executable", sys.executable)
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = sorted(glob.glob(f"{pyenv}/versions/{want}.*/bin/python{want}"),
                   key=lambda p: [int(x) if x.isdigit() else 0 for x in p.split("/")[-3].split(".")])
    if found:
        return found[-1]
    return shutil.which(f"python{want}")


def ensure(venv: Venv, log: object = print) -> Path:
    """The Python of ``venv``, made and filled first if needed; ``Unavailable`` if it cannot be."""
    path = ROOT / venv.folder
    python = path / "bin" / "python"
    base = interpreter(venv.python)
    if base is None:
        raise Unavailable(f"no Python {venv.python} interpreter found (looked for TASKCLAIM_BENCH_PYTHON"
                          f"{venv.python.replace('.', '')}, pyenv's versions/{venv.python}.*, python{venv.python} "
                          "on the PATH)")
    digest = hashlib.sha256("\n".join((base, *venv.requirements)).encode()).hexdigest()
    stamp = path / ".installed"
    with open(ROOT / f"{venv.folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run making the same virtualenv waits for it
        if stamp.exists() and stamp.read_text() == digest and python.exists():
            return python
        log(f"  making {venv.folder} with {base} and {', '.join(venv.requirements)} ...")  # type: ignore[operator]
        if path.exists():
            shutil.rmtree(path)
        _run([base, "-m", "venv", str(path)], f"python{venv.python} -m venv {venv.folder}")
        _run([str(python), "-m", "pip", "install", "-q", *venv.requirements],
             f"pip install {' '.join(venv.requirements)} (Python {venv.python})")
        stamp.write_text(digest)
    return python


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise Unavailable(f"{what} failed with exit code {proc.returncode}: "
                          + (proc.stderr.strip() or proc.stdout.strip())[-2000:])
