"""A PostgreSQL primary with a streaming standby on 127.0.0.1, and failover between them.

Debian's server binaries (``devtools.servers.PostgresServer``), started by the tests and the
fault harness, never as a service. Standard library only, like ``devtools.servers``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass

from .polling import wait_until
from .servers import ManagedServer, PostgresServer, free_port, without_libpq_env


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (read from /proc: Linux)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class PostgresNode(PostgresServer):
    """One server of a :class:`PostgresPair`: a :class:`PostgresServer` that can also be built
    as a standby of another node, promoted, and killed as if its machine had died.

    ``cluster_name`` is the node's name: a standby's WAL receiver uses it as its
    ``application_name``, which is the name ``synchronous_standby_names`` lists.
    """

    def __init__(self, name: str, settings: dict[str, str] | None = None) -> None:
        super().__init__(settings={"cluster_name": name, **(settings or {})})
        self.name = name

    def _tool(self, *cmd: str, stdin: str | None = None) -> str:
        """Run a client program of the server's ``bin`` folder; its output, or RuntimeError with its stderr."""
        argv = [os.path.join(self.bindir, cmd[0]), *cmd[1:]]
        if self.user:
            argv = ["runuser", "-u", self.user, "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, env=without_libpq_env(), check=False,
                              input=stdin)
        if done.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed on node {self.name} (port {self.port}): "
                               f"{done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def sql(self, statement: str, **values: str) -> str:
        """Run one SQL statement as ``postgres`` with ``psql``; its output, unaligned.

        ``values`` become psql variables, written ``:'name'`` in the statement: psql quotes them
        as literals (read from stdin, where psql interpolates; ``-c`` would not).
        """
        variables = [arg for name, value in values.items() for arg in ("-v", f"{name}={value}")]
        return self._tool("psql", "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", *variables,
                          "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", "postgres",
                          stdin=statement + ";\n").strip()

    def start_standby(self, primary: PostgresServer, stream_port: int | None = None) -> PostgresNode:
        """Copy ``primary`` with ``pg_basebackup -R`` (``standby.signal`` and ``primary_conninfo``)
        into an empty data folder and start streaming from it (through ``stream_port``, a
        :class:`LaggingLink`'s, if given: the copy itself goes straight to the primary)."""
        self._tool("pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
                   "-D", self.data, "-R", "-X", "stream", "--checkpoint=fast", "--no-sync")
        if stream_port is not None:
            # After the line -R wrote: the last setting of a configuration file wins.
            with open(os.path.join(self.data, "postgresql.auto.conf"), "a") as f:
                f.write(f"primary_conninfo = 'user=postgres host=127.0.0.1 port={stream_port}'\n")
        try:
            self._start()
        except subprocess.CalledProcessError:
            with open(self.log, errors="replace") as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"standby {self.name} did not start on port {self.port}; its log:\n{tail}") from None
        return self

    def promote(self) -> None:
        """End recovery: ``pg_ctl promote``, waiting until the node accepts writes."""
        self._tool("pg_ctl", "promote", "-D", self.data, "-w", "-t", "60")

    def postmaster_pid(self) -> int:
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            return int(f.readline())

    def kill(self) -> float:
        """SIGKILL the postmaster and every process it started, at once: the machine is gone.
        The wall-clock time of the kill.

        Stopped first so that it forks nothing between the listing of its children and the
        kill; children of a killed postmaster would otherwise run on until they noticed.
        """
        pid = self.postmaster_pid()
        os.kill(pid, signal.SIGSTOP)
        victims = [pid, *_children(pid)]
        killed = time.time()
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(_running(v) for v in victims):
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {self.name}: processes {victims} outlived SIGKILL")
            time.sleep(0.01)  # the kernel tears them down: poll /proc
        return killed

    def discard(self) -> None:
        """Remove the (dead) node's data folder and socket, keeping its port and log, to be built anew.

        The socket's lock file names the dead postmaster: a new one on the same port would
        refuse to start while that process id is still taken (by a zombie not yet reaped).
        """
        shutil.rmtree(self.data, ignore_errors=True)
        for name in (f".s.PGSQL.{self.port}", f".s.PGSQL.{self.port}.lock"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.dir, name))

    def stop(self) -> None:
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


class LaggingLink(ManagedServer):
    """A TCP relay on 127.0.0.1 that holds every chunk it receives ``delay`` seconds before
    passing it on: the replication connection of a standby that runs ``delay`` behind its primary
    (a distant or congested link, a busy standby).

    When the upstream side ends (the primary died), what the relay still holds is dropped, not
    delivered: that part of the stream had not left the primary. Each direction of each
    connection has a reader and a sender thread.

    :meth:`pause` holds everything from then on (the standby hears nothing, as behind a cut
    network) until :meth:`resume`: a commit made meanwhile on an asynchronous primary is one the
    standby cannot have, whatever the timing; the kill of the primary then drops it.
    """

    def __init__(self, upstream_port: int, delay: float) -> None:
        self.upstream_port = upstream_port
        self.delay = delay
        self.port = free_port()
        self.listener: socket.socket | None = None
        self.sockets: list[socket.socket] = []
        self.closed = threading.Event()
        self.flowing = threading.Event()
        self.flowing.set()

    def pause(self) -> None:
        """Hold every chunk from now on, in both directions, until :meth:`resume`."""
        self.flowing.clear()

    def resume(self) -> None:
        self.flowing.set()

    def start(self) -> LaggingLink:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, name=f"link:{self.port}", daemon=True).start()
        return self

    def _accept(self) -> None:
        assert self.listener is not None
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:
                if self.closed.is_set():
                    return
                continue  # the upstream is down: the client sees its connection closed
            upstream.settimeout(None)
            self.sockets += [client, upstream]
            dead = threading.Event()  # the upstream ended: drop what is held toward the client
            for src, dst, drop in ((client, upstream, None), (upstream, client, dead)):
                held: deque[tuple[float, bytes | None]] = deque()
                ready = threading.Condition()
                threading.Thread(target=self._read, args=(src, held, ready, drop), daemon=True).start()
                threading.Thread(target=self._send, args=(dst, held, ready, dead), daemon=True).start()

    def _read(self, src: socket.socket, held: deque[tuple[float, bytes | None]],
              ready: threading.Condition, drop: threading.Event | None) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            with ready:
                if not data:
                    if drop is not None:
                        drop.set()
                    held.append((0.0, None))
                    ready.notify()
                    return
                held.append((time.monotonic() + self.delay, data))
                ready.notify()

    def _send(self, dst: socket.socket, held: deque[tuple[float, bytes | None]],
              ready: threading.Condition, dead: threading.Event) -> None:
        while True:
            with ready:
                while not held:
                    ready.wait()
                due, data = held.popleft()
            if data is None or dead.is_set() or self.closed.is_set():
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_RDWR)
                dst.close()
                return
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # the lag being simulated
            while not self.flowing.wait(0.05) and not (dead.is_set() or self.closed.is_set()):
                pass  # paused: held until resumed, or dropped when the upstream ends or the relay stops
            if dead.is_set() or self.closed.is_set():
                continue  # dropped: the next item is the end marker
            try:
                dst.sendall(data)
            except OSError:
                dead.set()

    def stop(self) -> None:
        self.closed.set()
        for sock in [*(s for s in [self.listener] if s is not None), *self.sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@dataclass
class Failover:
    """One failover of a :class:`PostgresPair`, as wall-clock times (``time.time()``)."""

    killed: float
    promoted: float
    standby_ready: float | None
    old_primary: str
    new_primary: str
    #: WAL bytes the primary had that the standby had not flushed, read just before the kill;
    #: ``None`` if the standby was not streaming then (reconnecting after a restart, say).
    standby_behind: int | None = None
    #: How the primary failed (``devtools.patroni``): ``"kill"``, ``"stop"`` or ``"cut"`` (from etcd).
    how: str = "kill"
    #: After a cut: when the old primary was seen demoted by its own agent (``None``: not seen).
    old_demoted: float | None = None

    @property
    def unavailable(self) -> float:
        """Seconds from the kill to the end of the promotion: no server accepted writes."""
        return self.promoted - self.killed


class PostgresPair(ManagedServer):
    """A primary and one streaming standby on 127.0.0.1, and failover between them.

    ``synchronous=True`` (the default) lists the standby in the primary's
    ``synchronous_standby_names`` with ``synchronous_commit = on``: a commit is acknowledged only
    once the standby has flushed its WAL, so an acknowledged commit survives the loss of the
    primary. ``synchronous=False`` streams asynchronously: a commit is acknowledged once the
    primary alone has it.

    :meth:`failover` SIGKILLs the primary (every process of it), promotes the standby, then
    builds a new standby from the new primary (``pg_basebackup``) on the dead node's port, so
    that failovers can repeat. Until that standby streams, the new primary runs alone (its
    commits wait for nobody), as Patroni's ``synchronous_mode`` does; waiting instead
    (``synchronous_mode_strict``) would stop every write until the rebuild.

    Clients find the primary with a multi-host connection string: ``hosts``/``ports`` list both
    nodes and ``target_session_attrs=read-write`` skips the standby (``env`` has all three).

    ``lag`` (seconds) routes the standby's replication connection through a
    :class:`LaggingLink`: the standby receives the WAL that much later, and a synchronous commit
    waits twice that long.
    """

    def __init__(self, synchronous: bool = True, settings: dict[str, str] | None = None,
                 lag: float = 0.0) -> None:
        common = {"synchronous_commit": "on", "wal_level": "replica", **(settings or {})}
        self.synchronous = synchronous
        self.lag = lag
        self.link: LaggingLink | None = None
        self.nodes = [PostgresNode("node0", common), PostgresNode("node1", common)]
        self.primary, self.standby = self.nodes
        self.failovers: list[Failover] = []

    @property
    def hosts(self) -> str:
        return ",".join("127.0.0.1" for _ in self.nodes)

    @property
    def ports(self) -> str:
        return ",".join(str(node.port) for node in self.nodes)

    @property
    def env(self) -> dict[str, str]:
        return {"PGHOST": self.hosts, "PGPORT": self.ports, "PGUSER": "postgres", "PGPASSWORD": "",
                "PGDATABASE": "postgres", "PGTARGETSESSIONATTRS": "read-write"}

    def start(self) -> PostgresPair:
        self.primary.start()
        self._attach(self.standby)
        return self

    def _attach(self, standby: PostgresNode) -> None:
        """Build ``standby`` from the primary, wait until it streams, then make it synchronous.

        The base backup is taken before the primary names its standby, so a node never carries
        ``synchronous_standby_names`` into its own promotion; and the standby is named once it
        streams, so the primary's commits never wait for a standby still connecting.
        """
        if self.link is not None:
            self.link.stop()
            self.link = None
        if self.lag:
            self.link = LaggingLink(self.primary.port, self.lag).start()
        standby.start_standby(self.primary, stream_port=self.link.port if self.link else None)
        self._wait_streaming(standby, "async")
        if self.synchronous:
            self.primary.sql("ALTER SYSTEM SET synchronous_standby_names = :'name'", name=standby.name)
            self.primary.sql("SELECT pg_reload_conf()")
            self._wait_streaming(standby, "sync")

    def _wait_streaming(self, standby: PostgresNode, mode: str) -> None:
        wait_until(lambda: self.primary.sql(
            "SELECT state || ' ' || sync_state FROM pg_stat_replication WHERE application_name = :'name'",
            name=standby.name) == f"streaming {mode}",
            timeout=60, what=f"standby {standby.name} streaming ({mode}) from {self.primary.name}",
            interval=0.1)

    def failover(self) -> Failover:
        """Kill the primary, promote the standby, build a new standby; the times of each step."""
        old, new = self.primary, self.standby
        behind = old.sql("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn) FROM pg_stat_replication "
                         "WHERE application_name = :'name' AND state = 'streaming'", name=new.name)
        killed = old.kill()
        new.promote()
        promoted = time.time()
        self.primary, self.standby = new, old
        record = Failover(killed=killed, promoted=promoted, standby_ready=None, old_primary=old.name,
                          new_primary=new.name, standby_behind=int(float(behind)) if behind else None)
        self.failovers.append(record)
        old.discard()
        self._attach(old)
        record.standby_ready = time.time()
        return record

    def restart(self, mode: str = "immediate") -> None:
        """Crash and restart the primary in place (the standby reconnects to it)."""
        self.primary.restart(mode)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        if self.link is not None:
            self.link.stop()
