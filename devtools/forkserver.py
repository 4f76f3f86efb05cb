"""Children forked from a process that already set Django up: ``python -m MODULE ARGS`` for about
a hundredth of its CPU.

A fresh interpreter pays about 0.6 s of CPU to import Django and the app and fill the app
registry, and the test suite starts hundreds of children. A fork server is started (once per
interpreter, working directory and environment, on the second child asked for with them) as
``python -c BOOT``; it sets Django up (when the environment names its settings) without opening
a connection or a thread, then forks one child per request. Each child is an ordinary OS process:
its own pid and database connections, stdin, stdout and stderr given to it by the test (passed
over a Unix socket), signals sent to its pid (SIGKILL, SIGSTOP), a process group of its own when
asked, its module run as ``__main__`` with ``sys.argv`` as ``-m`` sets it, and its exit code as the
interpreter would give it. The fork server is its parent: it reports each exit over the socket,
and :class:`Forked` answers ``poll()`` and ``wait()`` as ``subprocess.Popen`` does.

``TASKCLAIM_FORKSERVER=0`` turns it off: every child a fresh interpreter again.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

#: Idle fork servers kept at once (each holds a set-up Django, about 60 MiB, shared by its children).
MOST_SERVERS = 6
#: The server's program: this file's ``serve``, with ``sys.path`` as ``python -m`` gives its children.
_BOOT = "import os, runpy, sys; sys.path[0] = os.getcwd(); runpy.run_path({path!r})['serve']({fd})"
_MESSAGE = 65536
#: In a forked child: the ``-m`` arguments it runs (what a fresh start of it runs again).
_child_argv: list[str] = []
#: Variables read only when used, never at import (libpq's, at connect): a child may have its own
#: value of them and still be forked from a server started with another (set after the fork).
LATE = frozenset({"PGAPPNAME"})
#: The environment Django was set up with in the server (and in its children, with their LATE ones).
_preloaded: dict[str, str] = {}


# -- in the child: run a module, or any callable, as the interpreter would ------------------------

def exit_code(run: Callable[[], object]) -> int:
    """Run ``run()`` as an interpreter runs its main module; the exit code it would give (a
    ``SystemExit``'s, 1 with the traceback printed on an uncaught exception). An uncaught
    ``KeyboardInterrupt`` ends the process by SIGINT, as the interpreter does."""
    try:
        run()
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)  # as the interpreter does with a message
        return 1
    except KeyboardInterrupt:
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException:
        traceback.print_exc()
        return 1


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _run_child(module: str, args: list[str], fds: list[int], group: bool, late: dict[str, str]) -> None:
    """In the forked child: its stdio, session and signals, then ``module`` as ``__main__``; never returns."""
    code = 1
    try:
        # The signals as a fresh interpreter has them (the server's SIGCHLD wake-up undone).
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if group:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds):
            if fd > 2:
                os.close(fd)
        import runpy

        for name in LATE:
            os.environ.pop(name, None)
        os.environ.update(late)
        if _preloaded:  # what this child's setup compares its environment with
            _preloaded.clear()
            _preloaded.update(os.environ)
        sys.argv = [module, *args]
        _child_argv[:] = [module, *args]
        code = exit_code(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))
        threading._shutdown()  # type: ignore[attr-defined]  # the interpreter waits for its threads at exit
        atexit._run_exitfuncs()
    finally:
        _flush()
        os._exit(code)


# -- the fork server ------------------------------------------------------------------------------

def serve(fd: int) -> None:
    """The fork server's loop on socket ``fd``: a child per request, each exit reported; ends with
    the socket (once its children have ended)."""
    sock = socket.socket(fileno=fd)
    _preload()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to be woken: the wake-up fd says it
    children: set[int] = set()
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    open_ = True
    while open_ or children:
        for key, _ in selector.select():
            if key.fileobj == wake_r:
                os.read(wake_r, 4096)
            elif open_:
                open_ = _request(sock, children, (sock.fileno(), wake_r, wake_w))
                if not open_:
                    selector.unregister(sock)
        _reap(sock if open_ else None, children)


def _preload() -> None:
    """Set Django up as the children would (their settings named by the environment), connecting to
    nothing and starting no thread: what is forked must hold no socket or lock of its own.

    A child that changes its environment before it sets Django up (another settings module, another
    database) cannot use what was set up here: its ``django.setup()`` starts it again as a fresh
    interpreter (``exec``: the same pid, pipes and arguments)."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return
    import django

    django.setup()
    _preloaded.update(os.environ)
    setup = django.setup

    def setup_or_start_afresh(*args: Any, **kwargs: Any) -> None:
        if dict(os.environ) != _preloaded:
            _flush()
            os.execv(sys.executable, [sys.executable, "-m", *_child_argv])
        setup(*args, **kwargs)

    django.setup = setup_or_start_afresh
    from django.db import connections

    opened = [alias for alias in connections if connections[alias].connection is not None]
    if opened or threading.active_count() != 1:
        raise RuntimeError(f"setting Django up opened connections {opened} or started threads "
                           f"({threading.enumerate()}): not safe to fork")


def _request(sock: socket.socket, children: set[int], own: tuple[int, ...]) -> bool:
    """Fork the child one request asks for and answer with its pid; False once the socket ended."""
    try:
        data, fds, _, _ = socket.recv_fds(sock, _MESSAGE, 3)
    except ConnectionError:
        return False
    if not data:
        return False
    request = json.loads(data)
    _flush()
    pid = os.fork()
    if pid == 0:
        for fd in own:
            os.close(fd)
        _run_child(request["module"], request["args"], fds, request["group"], request["late"])
    for fd in fds:
        os.close(fd)
    children.add(pid)
    sock.send(json.dumps({"pid": pid}).encode())
    return True


def _reap(sock: socket.socket | None, children: set[int]) -> None:
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            children.discard(pid)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


# -- the test's side ------------------------------------------------------------------------------

class Forked:
    """A child of a fork server, as ``subprocess.Popen`` shows a child of its own."""

    def __init__(self, pid: int, args: list[str], stdin: IO[str], stdout: IO[str]) -> None:
        self.pid, self.args, self.stdin, self.stdout = pid, args, stdin, stdout
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkServer:
    """One fork server process and the children it forked for this process."""

    def __init__(self, python: str, env: Mapping[str, str], cwd: str | Path | None) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        self.proc = subprocess.Popen(
            [python, "-c", _BOOT.format(path=__file__, fd=theirs.fileno())], env=dict(env), cwd=cwd,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=(theirs.fileno(),))
        theirs.close()
        self.lock = threading.Lock()  # one request at a time: its answer is the next pid message
        self.pids: dict[int, Forked] = {}
        self.early: dict[int, int] = {}
        self.answers: list[int] = []
        self.answered = threading.Condition()
        self.used = time.monotonic()
        self.reader = threading.Thread(target=self._read, name="forkserver-reader", daemon=True)
        self.reader.start()

    def start(self, module: str, args: list[str], *, group: bool, stderr: IO[bytes], late: Mapping[str, str]) -> Forked:
        """Fork ``python -m module args``: its stdin and stdout piped to us, its stderr to ``stderr``;
        ``late``: its own values of :data:`LATE` variables."""
        request = json.dumps({"module": module, "args": args, "group": group, "late": dict(late)}).encode()
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            with self.lock:
                socket.send_fds(self.sock, [request], [in_r, out_w, stderr.fileno()])
                pid = self._answer(60)
        finally:
            os.close(in_r)
            os.close(out_w)
        stdin = open(in_w, "w", encoding="utf-8", errors="replace")  # noqa: SIM115 (closed by its Child)
        stdout = open(out_r, encoding="utf-8", errors="replace")  # noqa: SIM115
        child = Forked(pid, [module, *args], stdin, stdout)
        with self.answered:
            self.pids[pid] = child
            if pid in self.early:
                child._exited(self.early.pop(pid))
        self.used = time.monotonic()
        return child

    def idle(self) -> bool:
        with self.answered:
            return all(child.returncode is not None for child in self.pids.values())

    def close(self) -> None:
        """End the server (once its children ended) and forget it."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(1)  # it ends once its children have
        self.sock.close()

    def _answer(self, timeout: float) -> int:
        with self.answered:
            if not self.answered.wait_for(lambda: self.answers or self.proc.poll() is not None, timeout):
                raise TimeoutError(f"fork server {self.proc.pid} did not answer within {timeout:g} s")
            if not self.answers:
                raise RuntimeError(f"fork server {self.proc.pid} exited with code {self.proc.returncode}")
            return self.answers.pop(0)

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(_MESSAGE)
            except OSError:
                data = b""
            with self.answered:
                if not data:
                    self.answered.notify_all()
                    return
                message = json.loads(data)
                if "pid" in message:
                    self.answers.append(message["pid"])
                elif message["exit"] in self.pids:
                    self.pids[message["exit"]]._exited(message["code"])
                else:  # exited before its pid was handed out
                    self.early[message["exit"]] = message["code"]
                self.answered.notify_all()


_servers: dict[tuple[str, str, tuple[tuple[str, str], ...]], ForkServer] = {}
_asked: dict[tuple[str, str, tuple[tuple[str, str], ...]], int] = {}
_broken: set[tuple[str, str, tuple[tuple[str, str], ...]]] = set()
_registry = threading.Lock()


def enabled() -> bool:
    return os.environ.get("TASKCLAIM_FORKSERVER", "1") != "0" and hasattr(socket, "send_fds")


def start(python: str, env: Mapping[str, str], cwd: str | Path | None, module: str, args: list[str], *,
          group: bool, stderr: IO[bytes]) -> Forked | None:
    """``python -m module args`` forked by the fork server of this interpreter, directory and
    environment, or ``None``: the first child of each is started afresh (a one-off environment
    costs no server), and so is every child when the server cannot be used."""
    if not enabled() or "LD_PRELOAD" in env:  # a library preloaded into a fresh process only
        return None
    key = (python, str(cwd or os.getcwd()), tuple(sorted((k, v) for k, v in env.items() if k not in LATE)))
    late = {k: v for k, v in env.items() if k in LATE}
    with _registry:
        server = _servers.get(key)
        if server is None:
            _asked[key] = _asked.get(key, 0) + 1
            if _asked[key] < 2 or key in _broken:
                return None
            _evict()
            server = _servers[key] = ForkServer(python, {k: v for k, v in env.items() if k not in LATE}, cwd)
    try:
        return server.start(module, args, group=group, stderr=stderr, late=late)
    except (OSError, RuntimeError, TimeoutError):  # it could not set Django up, say: never again for these
        with _registry:
            _broken.add(key)
            if _servers.get(key) is server:
                del _servers[key]
        server.close()
        return None


def _evict() -> None:
    """Keep at most :data:`MOST_SERVERS - 1` servers before a new one: the least recently used idle ones go."""
    idle = sorted((s.used, k) for k, s in _servers.items() if s.idle())
    for _, key in idle[:max(0, len(_servers) - MOST_SERVERS + 1)]:
        _servers.pop(key).close()


@atexit.register
def close_all() -> None:
    with _registry:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.close()
