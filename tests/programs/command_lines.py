"""``manage.py`` command lines, each in a process of its own forked from one that set Django up once:
``python -m tests.programs.command_lines``.

A usage error costs its command a few milliseconds; Django's start-up (the imports, the app
registry) costs a fresh ``python -m django`` over a second of CPU. The tests that run dozens of
command lines for their exit code and output pay it once here: the parent sets Django up without
opening a connection, says ``ready``, then for each JSON list of arguments read on its stdin
forks a child that runs ``django.core.management.execute_from_command_line`` exactly as
``python -m django ARGS`` does (its own pid, its own database connection, stdin from /dev/null,
stdout and stderr to files, its exit code from ``SystemExit`` or 1 with a traceback on an
uncaught exception), and answers with one ``done`` event: ``returncode``, ``stdout``, ``stderr``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from devtools.events import emit
from devtools.forkserver import exit_code


def run_forked(argv: list[str], prog: str) -> tuple[int, str, str]:
    """Fork a child running ``prog ARGV`` as ``python -m django`` would; its exit code, stdout and stderr."""
    from django.core.management import execute_from_command_line

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: the command line, then exit with its code
            code = 1
            try:
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                code = exit_code(lambda: execute_from_command_line([prog, *argv]))
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return (os.waitstatus_to_exitcode(status), out.read().decode(errors="replace"),
                err.read().decode(errors="replace"))


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.core.management import get_commands, load_command_class
    from django.db import connections

    # The commands of this app imported once, as the models were by setup(): a child only runs one.
    for name, app in get_commands().items():
        if app == "django_taskclaim":
            load_command_class(app, name)
    connections.close_all()  # none should be open; a child must never share its parent's socket
    # argv[0] as ``python -m django`` has it: usage messages name the program the same way.
    prog = os.path.join(os.path.dirname(django.__file__), "__main__.py")
    emit(event="ready", pid=os.getpid())
    for line in sys.stdin:
        if line.strip():
            code, out, err = run_forked(json.loads(line), prog)
            emit(event="done", returncode=code, stdout=out, stderr=err)


if __name__ == "__main__":
    main()
