"""``python3 -m example_project``: the demo, on a fresh clone with only the system Python.

Like ``python3 -m tests``, it first creates ``.venv`` with the app installed (reusing the
shared ``devtools.venv.ensure_venv``), then runs :mod:`example_project.simulator.main`.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from example_project.simulator.cli import parse_args

    args = parse_args(sys.argv[1:])  # --help and bad options answer before any install
    from devtools.venv import ensure_venv

    # [tasks]: the backport of Django's Tasks framework, for --worker on Django 5.2.
    ensure_venv("postgresql,langgraph,tasks,celery" if args.celery else "postgresql,langgraph,tasks")
    from example_project.simulator.main import main as demo_main

    return demo_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
