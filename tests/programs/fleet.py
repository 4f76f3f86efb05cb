"""N copies of a test program as N OS processes that pay Django's start-up once:
``python -m tests.programs.fleet N MODULE ARGS…`` (e.g. ``fleet 16 tests.programs.claimer race KEY``).

The parent sets Django up (the imports, the app registry: most of a child's start-up) without
opening a connection, then forks N children, each of which runs ``MODULE``'s ``main()`` with
``ARGS`` as a process of its own: its own database connection, its own pid, killable on its own.
Each child writes its events straight to the shared stdout (one JSON line a write, so lines of
different children never mix); each line the parent reads on its stdin goes to every child's
stdin, so one "go" releases them all. The parent exits once every child has, with code 0 if
each exited 0, else 1 (each failure named on stderr).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys


def main() -> None:
    copies, module, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    if copies < 1:
        raise SystemExit(f"fleet: N must be 1 or more, not {copies}")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connections

    import django_taskclaim.models  # noqa: F401  (the models' imports, paid once)

    program = importlib.import_module(module)
    connections.close_all()  # none should be open; a child must never share its parent's socket
    sys.stdout.flush()
    children: dict[int, int] = {}  # pid -> the write end of its stdin
    for _ in range(copies):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its own stdin, then the program as if started alone
            os.close(write)
            for other in children.values():
                os.close(other)
            os.dup2(read, 0)
            os.close(read)
            sys.stdin = open(0, closefd=False)  # noqa: SIM115 (fd 0, kept open)
            sys.argv = [module, *args]
            code = 0
            try:
                program.main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
        os.close(read)
        children[pid] = write
    for line in sys.stdin:  # every line to every child (a child that exited is skipped)
        for write in children.values():
            with contextlib.suppress(BrokenPipeError):
                os.write(write, line.encode())
    for write in children.values():
        os.close(write)
    failed = []
    for pid in children:
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            failed.append(f"process {pid} exited with code {code}")
    if failed:
        print("fleet: " + "; ".join(failed), file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
