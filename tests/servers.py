"""Throwaway PostgreSQL and Redis servers on 127.0.0.1 for tests, the harness and benchmarks.

Standard library only, so the test runner can use it before the virtualenv exists. As root,
PostgreSQL runs as the ``postgres`` system user (or ``nobody``), because it refuses root.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def postgres_bindir() -> str | None:
    """The newest PostgreSQL server ``bin`` folder on this machine, if any."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if found:
        return os.path.dirname(found[-1])
    pg_ctl = shutil.which("pg_ctl")
    return os.path.dirname(os.path.realpath(pg_ctl)) if pg_ctl else None


def _wait_for_port(port: int, deadline: float, what: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before it listened")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} in time")


class PostgresServer:
    """A private PostgreSQL cluster in a temporary folder."""

    def __init__(self, port: int | None = None, settings: dict[str, str] | None = None) -> None:
        bindir = postgres_bindir()
        if bindir is None:
            raise RuntimeError(
                "PostgreSQL server binaries not found; install Debian's 'postgresql' package "
                "(apt-get install postgresql) or point PGHOST/PGPORT at a server"
            )
        self.bindir = bindir
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="taskclaim-pg-")
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "server.log")
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": self.dir,
            "max_connections": "300",
            # Durable against a server crash (committed WAL reaches the kernel before the
            # reply), not against a machine crash: right for tests and fault injection.
            "fsync": "off",
            "full_page_writes": "off",
            "shared_buffers": "128MB",
            **(settings or {}),
        }
        self.user: str | None = None
        if os.geteuid() == 0:
            for name in ("postgres", "nobody"):
                try:
                    pwd.getpwnam(name)
                    self.user = name
                    break
                except KeyError:
                    continue
            if self.user is None:
                raise RuntimeError("running as root and no 'postgres' or 'nobody' user to run PostgreSQL")
            shutil.chown(self.dir, self.user)
            os.chmod(self.dir, 0o755)

    def _run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        argv = [os.path.join(self.bindir, cmd[0]), *cmd[1:]]
        if self.user:
            argv = ["runuser", "-u", self.user, "--", *argv]
        return subprocess.run(argv, check=check, capture_output=True)

    @property
    def env(self) -> dict[str, str]:
        return {"PGHOST": "127.0.0.1", "PGPORT": str(self.port), "PGUSER": "postgres",
                "PGPASSWORD": "", "PGDATABASE": "postgres"}

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> PostgresServer:
        self._run("initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        self._start()
        return self

    def _start(self) -> None:
        opts = " ".join(f"-c {k}={v}" for k, v in self.settings.items())
        self._run("pg_ctl", "-D", self.data, "-l", self.log, "-o", f"-p {self.port} {opts}", "-w", "-t", "60", "start")
        _wait_for_port(self.port, time.monotonic() + 30, "PostgreSQL")

    def restart(self, mode: str = "immediate") -> None:
        """Stop (``immediate`` is a crash: no checkpoint) and start again on the same port."""
        self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "stop", check=False)
        self._start()

    def stop(self) -> None:
        self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisServer:
    """A private ``redis-server`` on a free port, no persistence."""

    def __init__(self, port: int | None = None) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise RuntimeError("redis-server not found; install Debian's 'redis-server' package")
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="taskclaim-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        _wait_for_port(self.port, time.monotonic() + 20, "redis-server", self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def restart(self) -> None:
        self.stop()
        self.dir = tempfile.mkdtemp(prefix="taskclaim-redis-")
        self.start()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
