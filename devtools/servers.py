"""Throwaway PostgreSQL, Redis and RabbitMQ servers on 127.0.0.1 for tests, the harness and benchmarks.

Standard library only, so the test runner can use it before the virtualenv exists. As root,
PostgreSQL runs as the ``postgres`` system user (or ``nobody``), because it refuses root.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any, Self

#: Seconds a server's own tool (initdb, pg_ctl, the MariaDB client) may take before it is given up
#: on, naming it: no tool of a healthy server takes a tenth of that on a loaded 2-core machine.
TOOL_DEADLINE = 180


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


def without_libpq_env() -> dict[str, str]:
    """This process's environment without libpq's ``PG*`` variables, for the server and its tools.

    The server takes its default port from ``PGPORT``, and the client tools their host, port and
    target session from the others: a client's multi-host ``PGHOST``/``PGPORT`` (a
    :class:`~devtools.replication.PostgresPair`'s) would make the server refuse to start and the tools go elsewhere.
    """
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


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


def _end(proc: subprocess.Popen[bytes] | None, grace: float) -> None:
    """Stop a server process started here: SIGTERM, then SIGKILL if it outlives ``grace`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ManagedServer:
    """A server the tests start and stop: ``with Server() as server:`` always stops it again."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _parent_pid(pid: int) -> int | None:
    """The parent of process ``pid`` (``None`` once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # after "(comm)": state, then the parent


class PostgresServer(ManagedServer):
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
        """Run one of the server's tools; ``TimeoutExpired`` naming it past ``TOOL_DEADLINE`` seconds
        (``pg_ctl`` gives up after its own ``-t``, 60 s, first)."""
        argv = [os.path.join(self.bindir, cmd[0]), *cmd[1:]]
        if self.user:
            argv = ["runuser", "-u", self.user, "--", *argv]
        return subprocess.run(argv, check=check, capture_output=True, env=without_libpq_env(), timeout=TOOL_DEADLINE)

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
        self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop", check=False)
        self._start()

    def halt(self, mode: str = "fast") -> None:
        """Stop the server and keep its data: :meth:`resume` starts it again on the same port."""
        self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop")

    def resume(self) -> None:
        """Start a server :meth:`halt` stopped."""
        self._start()

    def running(self) -> bool:
        """Whether the server runs (``pg_ctl status``): stopped by :meth:`halt`, it does not."""
        return self._run("pg_ctl", "-D", self.data, "status", check=False).returncode == 0

    def processes(self) -> list[int]:
        """The server's process ids: its postmaster first, then every process it started (none
        when it is not running)."""
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                main = int(f.readline())
        except FileNotFoundError:  # stopped (pg_ctl removes the file), or never started
            return []
        children = []
        for name in os.listdir("/proc"):
            if name.isdigit() and _parent_pid(int(name)) == main:
                children.append(int(name))
        return [main, *children]

    def freeze(self, *, postmaster_only: bool = False) -> list[int]:
        """SIGSTOP the server (every process, or its postmaster alone) and return the ids stopped,
        for :meth:`thaw` (or use :meth:`frozen`). A stopped server's kernel still accepts
        connections and acknowledges what is sent: a client waits for its answer, no socket
        timeout fires.

        A child that exits between the listing and its signal (the backend of a connection just
        closed, reaped by the postmaster before it was stopped) needs no stopping and is left out.
        Any other failure continues what was already stopped before it is raised: a failed freeze
        never leaves the postmaster stopped, on which every later connection would wait for ever.
        """
        pids = self.processes()[:1] if postmaster_only else self.processes()
        if not pids:
            raise RuntimeError(f"PostgreSQL on port {self.port} is not running: nothing to freeze")
        stopped: list[int] = []
        try:
            for pid in pids:  # the postmaster first: it starts no new process meanwhile
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    if pid == pids[0]:
                        raise RuntimeError(f"the postmaster of PostgreSQL on port {self.port} (pid {pid}) "
                                           "exited: nothing to freeze") from None
                    continue  # a child that exited meanwhile
                stopped.append(pid)
        except BaseException:
            self.thaw(stopped)
            raise
        return stopped

    @contextlib.contextmanager
    def frozen(self, *, postmaster_only: bool = False) -> Iterator[list[int]]:
        """:meth:`freeze` for the block, :meth:`thaw` on the way out however it ends."""
        stopped = self.freeze(postmaster_only=postmaster_only)
        try:
            yield stopped
        finally:
            self.thaw(stopped)

    @staticmethod
    def thaw(pids: list[int]) -> None:
        """SIGCONT what :meth:`freeze` stopped."""
        for pid in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def thaw_all(self) -> None:
        """SIGCONT every process of the server (harmless to one that runs): whatever a failed test
        left stopped, so that neither a connection nor ``pg_ctl stop`` waits on it for ever."""
        self.thaw(self.processes())  # the postmaster last, as after freeze()

    def description(self) -> str:
        """What another process needs to halt and resume this server (:meth:`attached`), as JSON."""
        return json.dumps({"bindir": self.bindir, "port": self.port, "dir": self.dir, "settings": self.settings,
                           "user": self.user})

    @classmethod
    def attached(cls, description: str) -> PostgresServer:
        """The server another process started and described (:meth:`description`): to halt and
        resume it from here. Stopping it for good stays with the process that started it."""
        found = cls.__new__(cls)
        values = json.loads(description)
        found.bindir, found.port, found.dir = values["bindir"], int(values["port"]), values["dir"]
        found.settings, found.user = values["settings"], values["user"]
        found.data, found.log = os.path.join(found.dir, "data"), os.path.join(found.dir, "server.log")
        return found

    def stop(self) -> None:
        """Stop the server for good and remove its folder; a server left frozen is continued first
        (stopped, its postmaster would never see pg_ctl's signal: pg_ctl would give up after 60 s
        and leave it behind, holding its port and memory), and one that ignores a fast shutdown
        is stopped in immediate mode."""
        self.thaw_all()
        if self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "-t", "60", "stop", check=False).returncode:
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "-t", "30", "stop", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


class MariaDBServer(ManagedServer):
    """A private MariaDB (or MySQL) server in a temporary folder, on 127.0.0.1 only.

    Started as the ``mysql`` system user where there is one (the server refuses root unless
    told otherwise), with a data directory that user owns. ``root`` logs in without a password
    over TCP from 127.0.0.1 only.
    """

    def __init__(self, port: int | None = None) -> None:
        server = shutil.which("mariadbd") or shutil.which("mysqld") or (
            "/usr/sbin/mariadbd" if os.path.exists("/usr/sbin/mariadbd") else None)
        install_db = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
        if server is None or install_db is None:
            raise RuntimeError("MariaDB server binaries not found; install Debian's 'mariadb-server' package")
        self.server, self.install_db = server, install_db
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="taskclaim-mariadb-")
        self.data = os.path.join(self.dir, "data")
        self.socket = os.path.join(self.dir, "mysqld.sock")
        self.log = os.path.join(self.dir, "server.log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.user = "root"
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("mysql")
                self.user = "mysql"
            except KeyError:
                self.user = "root"
            shutil.chown(self.dir, self.user)
            os.chmod(self.dir, 0o755)

    @property
    def env(self) -> dict[str, str]:
        return {"MYSQL_HOST": "127.0.0.1", "MYSQL_TCP_PORT": str(self.port), "MYSQL_USER": "root"}

    def start(self) -> MariaDBServer:
        subprocess.run(
            [self.install_db, f"--datadir={self.data}", f"--user={self.user}", "--skip-test-db",
             "--auth-root-authentication-method=normal", "--skip-name-resolve"],
            check=True, capture_output=True, timeout=TOOL_DEADLINE,
        )
        self.proc = subprocess.Popen(
            [self.server, "--no-defaults", f"--datadir={self.data}", f"--user={self.user}", f"--port={self.port}",
             "--bind-address=127.0.0.1", f"--socket={self.socket}", f"--pid-file={self.dir}/mysqld.pid",
             f"--log-error={self.log}", "--skip-name-resolve", "--max-connections=300",
             # Durable against a server crash, not a machine crash: right for tests (as for PostgreSQL).
             "--innodb-flush-log-at-trx-commit=2", "--innodb-doublewrite=0", "--innodb-buffer-pool-size=128M",
             "--character-set-server=utf8mb4", "--collation-server=utf8mb4_unicode_ci",
             "--transaction-isolation=READ-COMMITTED"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        _wait_for_port(self.port, time.monotonic() + 60, "MariaDB", self.proc)
        # The root account made by install-db is root@localhost: allow it from 127.0.0.1 by TCP.
        self.sql("CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; "
                 "GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION; FLUSH PRIVILEGES;")
        return self

    def sql(self, statements: str) -> None:
        """Run SQL as root through this server's socket with the command-line client.

        Over the socket, and with the client's MYSQL_* environment variables removed: given
        MYSQL_HOST and MYSQL_TCP_PORT (those of another server, in a test run), it would go there.
        """
        client = shutil.which("mariadb") or shutil.which("mysql") or "mariadb"
        env = {k: v for k, v in os.environ.items() if not k.startswith("MYSQL_")}
        subprocess.run([client, "--protocol=SOCKET", f"--socket={self.socket}", "-uroot", "--connect-timeout=30",
                        "-e", statements], check=True, capture_output=True, env=env, timeout=TOOL_DEADLINE)

    def create_database(self, name: str) -> None:
        """An empty utf8mb4 database (for processes that connect to it by name, as the harness's)."""
        self.sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")

    def stop(self) -> None:
        _end(self.proc, grace=30)
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisServer(ManagedServer):
    """A private ``redis-server`` on a free port, no persistence."""

    def __init__(self, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found; install Debian's 'redis-server' package")
        self.binary: str = binary
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
        _end(self.proc, grace=10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def restart(self) -> None:
        self.stop()
        self.dir = tempfile.mkdtemp(prefix="taskclaim-redis-")
        self.start()


RABBITMQ_SCRIPT = "/usr/lib/rabbitmq/bin/rabbitmq-server"


class RabbitMQServer(ManagedServer):
    """A private RabbitMQ node on free ports, its data in a temporary folder.

    Debian's ``rabbitmq-server`` (its ``/usr/lib/rabbitmq/bin`` scripts, not the service).
    As root, the node runs as the ``rabbitmq`` user, which owns the folder. It gets its own
    ``epmd`` (Erlang's port mapper) on a free port, started and stopped here, so nothing of it
    outlives :meth:`stop`. ``config`` lines go to its ``rabbitmq.conf`` (e.g.
    ``{"consumer_timeout": "5000"}``); ``advanced`` is an Erlang term list for settings the
    ``.conf`` format lacks. ``channel_tick_interval`` (default 60 s, here 1 s) is how often a
    channel looks for deliveries past ``consumer_timeout``.

    A restart keeps the data folder: durable queues and their persistent messages (Celery's
    defaults) survive it, unlike the queues of :class:`RedisServer`.
    """

    def __init__(self, config: dict[str, str] | None = None, advanced: str | None = None,
                 channel_tick_interval: int = 1000) -> None:
        if not os.path.exists(RABBITMQ_SCRIPT) or shutil.which("epmd") is None:
            raise RuntimeError("rabbitmq-server not found; install Debian's 'rabbitmq-server' package")
        self.port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.dir = tempfile.mkdtemp(prefix="taskclaim-rabbitmq-")
        self.node = f"taskclaim{self.port}@localhost"
        self.config = {"listeners.tcp.1": f"127.0.0.1:{self.port}", "loopback_users": "none",
                       "log.console": "true", "log.console.level": "warning", "log.file": "false",
                       **(config or {})}
        self.advanced = advanced or f"[{{rabbit, [{{channel_tick_interval, {channel_tick_interval}}}]}}]."
        self.user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("rabbitmq")
            except KeyError:
                raise RuntimeError("running as root and no 'rabbitmq' user to run RabbitMQ") from None
            self.user = "rabbitmq"
        self.proc: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    @property
    def log(self) -> str:
        return os.path.join(self.dir, "server.log")

    def _env(self) -> dict[str, str]:
        d = self.dir
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": d, "LANG": "C.UTF-8",
            "RABBITMQ_NODENAME": self.node, "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port), "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port), "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": os.path.join(d, "mnesia"), "RABBITMQ_LOG_BASE": os.path.join(d, "log"),
            "RABBITMQ_CONFIG_FILE": os.path.join(d, "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": os.path.join(d, "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": os.path.join(d, "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": os.path.join(d, "rabbitmq-env.conf"),
            "RABBITMQ_PID_FILE": os.path.join(d, "rabbitmq.pid"),
        }

    def _prepare(self) -> None:
        d = self.dir
        for sub in ("mnesia", "log"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        with open(os.path.join(d, "rabbitmq.conf"), "w") as f:
            f.writelines(f"{k} = {v}\n" for k, v in self.config.items())
        with open(os.path.join(d, "advanced.config"), "w") as f:
            f.write(self.advanced + "\n")
        with open(os.path.join(d, "enabled_plugins"), "w") as f:
            f.write("[].\n")
        open(os.path.join(d, "rabbitmq-env.conf"), "w").close()  # noqa: SIM115 (empty file)
        if self.user:
            for root, dirs, files in os.walk(d):
                for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                    shutil.chown(name, self.user, self.user)

    def _popen(self, argv: list[str], out: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, cwd=self.dir, env=self._env(), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                user=self.user, group=self.user)

    def start(self) -> RabbitMQServer:
        self._prepare()
        if self.epmd is None or self.epmd.poll() is not None:
            self.epmd = self._popen(["epmd", "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                                    subprocess.DEVNULL)
            _wait_for_port(self.epmd_port, time.monotonic() + 10, "epmd", self.epmd)
        with open(self.log, "ab") as out:
            self.proc = self._popen([RABBITMQ_SCRIPT], out)
        try:
            # The AMQP listener opens last, once the node has booted.
            _wait_for_port(self.port, time.monotonic() + 90, "rabbitmq-server", self.proc)
        except RuntimeError as exc:
            with open(self.log, errors="replace") as f:
                raise RuntimeError(f"{exc}; its log:\n{f.read()[-3000:]}") from None
        return self

    def kill(self) -> None:
        """SIGKILL the node (a crash); unacknowledged deliveries go back to their queues."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def _stop_node(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the script forwards it: a clean stop
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        """Stop the node cleanly and start it again on the same ports and data."""
        self._stop_node()
        self.start()

    def stop(self) -> None:
        self._stop_node()
        if self.epmd is not None and self.epmd.poll() is None:
            self.epmd.terminate()
            self.epmd.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class PgBouncerServer(ManagedServer):
    """A private PgBouncer (Debian's ``pgbouncer``) in front of a PostgreSQL server.

    Transaction pool mode by default: each transaction (each statement in autocommit) may run on
    a different server session, as in the deployments docs/configurations.md describes. Every
    database name is forwarded to the upstream server as user ``postgres``, without a password.
    """

    def __init__(self, upstream_port: int, port: int | None = None, pool_mode: str = "transaction",
                 pool_size: int = 10) -> None:
        binary = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer")
                                               else None)
        if binary is None:
            raise RuntimeError("pgbouncer not found; install Debian's 'pgbouncer' package")
        self.binary: str = binary
        self.upstream_port = upstream_port
        self.port = port or free_port()
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.dir = tempfile.mkdtemp(prefix="taskclaim-pgbouncer-")
        self.proc: subprocess.Popen[bytes] | None = None
        # PgBouncer refuses to run as root: drop to the user PostgreSQL runs as.
        self.user: str | None = None
        if os.geteuid() == 0:
            for name in ("postgres", "nobody"):
                try:
                    pwd.getpwnam(name)
                    self.user = name
                    break
                except KeyError:
                    continue
            if self.user is not None:
                shutil.chown(self.dir, self.user)

    @property
    def env(self) -> dict[str, str]:
        return {"PGHOST": "127.0.0.1", "PGPORT": str(self.port), "PGUSER": "postgres",
                "PGPASSWORD": "", "PGDATABASE": "postgres"}

    @property
    def log(self) -> str:
        return os.path.join(self.dir, "pgbouncer.log")

    def start(self) -> PgBouncerServer:
        ini = os.path.join(self.dir, "pgbouncer.ini")
        with open(ini, "w") as f:
            f.write(
                "[databases]\n"
                f"* = host=127.0.0.1 port={self.upstream_port} user=postgres\n"
                "[pgbouncer]\n"
                f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
                f"auth_type = any\npool_mode = {self.pool_mode}\n"
                f"default_pool_size = {self.pool_size}\nmax_client_conn = 1000\n"
                # Django's test runner drops the test database at the end; idle server sessions
                # would keep it busy, so close them quickly.
                "server_idle_timeout = 1\nserver_lifetime = 3600\n"
                "ignore_startup_parameters = extra_float_digits,options\n"
                "log_connections = 0\nlog_disconnections = 0\n"
                f"logfile = {self.log}\npidfile = {os.path.join(self.dir, 'pgbouncer.pid')}\n"
            )
        argv = [self.binary, ini]
        if self.user:
            argv[1:1] = ["-u", self.user]
        # Not a pipe: PgBouncer logs every login to stderr too, and would block once it filled.
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for_port(self.port, time.monotonic() + 20, "pgbouncer", self.proc)
        return self

    def stop(self) -> None:
        _end(self.proc, grace=10)
        shutil.rmtree(self.dir, ignore_errors=True)
