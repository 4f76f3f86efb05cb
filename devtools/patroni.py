"""A three-node Patroni cluster with one etcd, on 127.0.0.1, for tests: Patroni decides each failover.

Debian's packages (``patroni``, ``etcd-server``), started as plain processes (no service manager),
their data under one temporary folder. As root, Patroni and the PostgreSQL it starts run as the
``postgres`` user, which PostgreSQL needs. Standard library only, like ``devtools.servers``.

Clients reach the leader as they reach a :class:`~devtools.replication.PostgresPair`'s primary: a
multi-host ``HOST``/``PORT`` with ``target_session_attrs=read-write`` (:attr:`env`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from .polling import wait_until
from .replication import Failover, LaggingLink, _children, _running
from .servers import ManagedServer, free_port, postgres_bindir, without_libpq_env

# Each agent reaches etcd through a relay of its own (PatroniNode.link), to cut. ``use_proxies``:
# without it Patroni takes ``hosts`` as seeds only and asks etcd for its members, whose advertised
# address is etcd's own port, so the agents would talk to etcd directly, around the relays.
NODE = """scope: taskclaim
name: {name}
restapi:
  listen: 127.0.0.1:{api}
  connect_address: 127.0.0.1:{api}
etcd3:
  hosts: 127.0.0.1:{etcd}
  use_proxies: true
bootstrap:
  dcs:
    ttl: {ttl}
    loop_wait: 1
    retry_timeout: {retry}
    maximum_lag_on_failover: 1073741824
    synchronous_mode: {synchronous}
    postgresql:
      use_pg_rewind: false
      parameters:
        wal_level: replica
        hot_standby: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        fsync: "off"
        full_page_writes: "off"
  initdb:
  - encoding: UTF8
  - auth: trust
  pg_hba:
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{port}
  connect_address: 127.0.0.1:{port}
  data_dir: {dir}/data
  bin_dir: {bindir}
  pgpass: {dir}/pgpass
  authentication:
    replication:
      username: postgres
    superuser:
      username: postgres
  parameters:
    unix_socket_directories: {dir}
    max_connections: 200
"""


class PatroniNode:
    """One member: its Patroni agent (a process) and the PostgreSQL that agent runs."""

    def __init__(self, name: str, root: str) -> None:
        self.name = name
        self.port, self.api = free_port(), free_port()
        self.dir = os.path.join(root, name)
        self.process: subprocess.Popen[bytes] | None = None
        #: The member's own way to etcd (a relay with no delay): paused, its network to etcd is cut.
        self.link: LaggingLink | None = None

    def state(self) -> dict[str, Any]:
        """Patroni's REST view of the member (``role``, ``state``, ``timeline``…); ``{}`` if it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.api}/patroni", timeout=2) as reply:
                return dict(json.load(reply))
        except (OSError, ValueError):
            return {}

    def postgres_pids(self) -> list[int]:
        try:
            with open(os.path.join(self.dir, "data", "postmaster.pid")) as f:
                main = int(f.readline())
        except (FileNotFoundError, ValueError):
            return []
        return [main, *_children(main)]

    def freeze(self) -> tuple[float, list[int]]:
        """SIGSTOP the agent and its PostgreSQL (a hung machine: connections to it hang, nothing
        answers, nothing resets); the wall-clock time and the processes stopped."""
        victims = [p for p in [self.process.pid if self.process else None] if p] + self.postgres_pids()
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)  # nothing forks or restarts between the listing and the kill
        return time.time(), victims

    def cut(self) -> float:
        """Cut the agent's network to etcd (its relay holds every byte from now on, both ways, as a
        network that drops packets does: requests time out rather than fail); the wall-clock time.
        PostgreSQL and the REST API still answer: Patroni's agent must demote it by itself."""
        assert self.link is not None, f"{self.name} not started"
        self.link.pause()
        return time.time()

    def drop_link(self) -> None:
        """Close the relay to etcd and whatever it holds (nothing a cut held reaches etcd late):
        the member, started again, gets a new one."""
        if self.link is not None:
            self.link.stop()
            self.link = None

    def kill(self, frozen: list[int] | None = None) -> float:
        """SIGKILL the agent and its PostgreSQL at once (the machine is gone; ``frozen``: the
        processes :meth:`freeze` stopped, killed now); the wall-clock time."""
        victims = frozen if frozen is not None else self.freeze()[1]
        killed = time.time()
        for pid in victims + [c for v in victims for c in _children(v)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait(30)
        wait_until(lambda: not any(_running(v) for v in victims), timeout=30, what=f"{self.name} gone",
                   interval=0.02)
        return killed


class PatroniCluster(ManagedServer):
    """etcd and three Patroni members; :meth:`leader` is the member that accepts writes.

    ``synchronous=True`` sets Patroni's ``synchronous_mode`` (a replica is named synchronous; a
    commit waits for it). ``ttl`` is the leader key's lifetime in etcd: how long a dead leader
    keeps it before a replica may take over (Patroni's default is 30 s; 10 here).
    """

    def __init__(self, synchronous: bool = False, ttl: int = 10) -> None:
        if shutil.which("patroni") is None or shutil.which("etcd") is None:
            raise RuntimeError("patroni or etcd not found: apt-get install patroni etcd-server")
        self.bindir = postgres_bindir()
        self.synchronous, self.ttl = synchronous, ttl
        self.root = tempfile.mkdtemp(prefix="taskclaim-patroni-")
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user:
            shutil.chown(self.root, self.user)
            os.chmod(self.root, 0o755)
        self.etcd_port, self.etcd_peer = free_port(), free_port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self.nodes = [PatroniNode(f"node{i}", self.root) for i in range(3)]
        self.failovers: list[Failover] = []
        #: After :meth:`fail_over` ``how="cut"``: when the old leader was seen demoted.
        self.demoted: float | None = None

    @property
    def env(self) -> dict[str, str]:
        return {"PGHOST": ",".join("127.0.0.1" for _ in self.nodes),
                "PGPORT": ",".join(str(n.port) for n in self.nodes), "PGUSER": "postgres", "PGPASSWORD": "",
                "PGDATABASE": "postgres", "PGTARGETSESSIONATTRS": "read-write"}

    def start(self) -> PatroniCluster:
        log = open(os.path.join(self.root, "etcd.log"), "wb")  # noqa: SIM115 - the process keeps it
        self.etcd = subprocess.Popen(
            ["etcd", "--name", "e0", "--data-dir", os.path.join(self.root, "etcd"),
             "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
             "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
             "--listen-peer-urls", f"http://127.0.0.1:{self.etcd_peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.etcd_peer}",
             "--initial-cluster", f"e0=http://127.0.0.1:{self.etcd_peer}"],
            stdout=log, stderr=subprocess.STDOUT, env=without_libpq_env())
        # With use_proxies, an agent reads etcd's /version as it starts, and exits on the
        # "not_decided" cluster version of an etcd just started: wait until etcd has decided it.
        wait_until(self._etcd_ready, timeout=60, what="etcd answering with its cluster version", interval=0.1)
        for node in self.nodes:
            self._start_node(node)
        self.wait_healthy()
        return self

    def _etcd_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.etcd_port}/version", timeout=2) as reply:
                return str(json.load(reply).get("etcdcluster", "")).split(".")[0].isdigit()
        except (OSError, ValueError):
            return False

    def _start_node(self, node: PatroniNode) -> None:
        os.makedirs(node.dir, exist_ok=True)
        if node.link is None:
            node.link = LaggingLink(self.etcd_port, 0.0).start()
        config = os.path.join(node.dir, "patroni.yml")
        with open(config, "w") as f:
            f.write(NODE.format(name=node.name, api=node.api, etcd=node.link.port, ttl=self.ttl,
                                retry=max(2, self.ttl // 2 - 1), synchronous=str(self.synchronous).lower(),
                                port=node.port, dir=node.dir, bindir=self.bindir))
        if self.user:
            for path in (node.dir, config):
                shutil.chown(path, self.user)
            os.chmod(node.dir, 0o700)
        argv = ["patroni", config]
        if self.user:
            argv = ["runuser", "-u", self.user, "--", *argv]
        log = open(os.path.join(self.root, f"{node.name}.log"), "ab")  # noqa: SIM115 - the process keeps it
        node.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=without_libpq_env(),
                                        cwd=node.dir)

    def leader(self) -> PatroniNode | None:
        for node in self.nodes:
            state = node.state()
            if state.get("role") in ("master", "primary") and state.get("state") == "running":
                return node
        return None

    def wait_healthy(self, timeout: float = 120) -> PatroniNode:
        """Until one leader runs and every other member live replicates; the leader."""
        def healthy() -> bool:
            states = [n.state() for n in self.nodes if n.process is not None and n.process.poll() is None]
            roles = sorted(s.get("role", "") for s in states)
            return (len(states) == len(self.nodes) and all(s.get("state") == "running" for s in states)
                    and roles.count("replica") == len(states) - 1)
        wait_until(healthy, timeout=timeout, what="a Patroni leader and its replicas running", interval=0.2)
        leader = self.leader()
        assert leader is not None
        return leader

    def wait_replicated(self, timeout: float = 60) -> None:
        """Until every replica has replayed what the leader had written when this was called and,
        with ``synchronous_mode``, one of them is the synchronous standby: what a test wrote so far
        is on every member, whichever one Patroni promotes next (right after start-up a replica may
        still lag, and no standby is named synchronous yet)."""
        leader = self.leader()
        assert leader is not None, "no leader"
        written = int(leader.state().get("xlog", {}).get("location", 0))

        def caught_up() -> bool:
            states = [n.state() for n in self.nodes if n is not leader]
            return (all(int(s.get("xlog", {}).get("replayed_location", 0)) >= written for s in states)
                    and (not self.synchronous or any(s.get("sync_standby") for s in states)))
        wait_until(caught_up, timeout=timeout, what="the replicas replaying the leader's writes", interval=0.1)

    def fail_over(self, timeout: float = 120, how: str = "kill", on_fault: Callable[[PatroniNode], None] | None = None,
                  ) -> tuple[PatroniNode, PatroniNode, float, float]:
        """Fail the leader, ``how``: ``"kill"`` (SIGKILL, the machine gone), ``"stop"`` (SIGSTOP, a
        hung machine) or ``"cut"`` (its agent's network to etcd cut: it cannot renew the leader key,
        while its PostgreSQL, its REST API and its replication still answer); wait until Patroni
        promotes another member. A hung or cut member is then SIGKILLed (fenced, as a STONITH
        would). ``on_fault(old)`` runs right after the fault (a test's writes to the cut leader).
        (old, new, the time of the fault, the promotion seen); after a cut,
        :attr:`demoted` is when the old leader was first seen demoted (its REST API no longer
        saying primary), ``None`` if never before the promotion."""
        old = self.leader()
        assert old is not None, "no leader to fail"
        if how not in ("kill", "stop", "cut"):
            raise ValueError(f"how must be 'kill', 'stop' or 'cut', not {how!r}")
        frozen: list[int] = []
        self.demoted = None
        if how == "kill":
            killed = old.kill()
        elif how == "stop":
            killed, frozen = old.freeze()
        else:
            killed = old.cut()
        if on_fault is not None:
            on_fault(old)
        holder: list[PatroniNode] = []

        def promoted() -> bool:
            if how == "cut" and self.demoted is None:
                state = old.state()  # {} if it does not answer in time: not a demotion
                if state and state.get("role") not in ("master", "primary"):
                    self.demoted = time.time()
            # Another member than the old leader (which may still answer, and call itself one).
            for new in self.nodes:
                state = new.state() if new is not old else {}
                if state.get("role") in ("master", "primary") and state.get("state") == "running":
                    holder.append(new)
                    return True
            return False
        wait_until(promoted, timeout=timeout, what="Patroni promoting a replica", interval=0.1)
        seen = time.time()
        if frozen:
            old.kill(frozen)
        elif how == "cut":
            old.kill()
            old.drop_link()
        return old, holder[0], killed, seen

    def failover(self, how: str = "kill") -> Failover:
        """The harness's failover (``tests.chaos --ha patroni``): the leader's machine SIGKILLed,
        hung or cut from etcd (``how``, :meth:`fail_over`), Patroni promoting a replica, then the
        dead member started afresh (an empty data folder: Patroni makes it a replica of the new
        leader) and the cluster healthy again."""
        old, new, killed, promoted = self.fail_over(how=how)
        record = Failover(killed=killed, promoted=promoted, standby_ready=None, old_primary=old.name,
                          new_primary=new.name, how=how, old_demoted=self.demoted)
        self.failovers.append(record)
        shutil.rmtree(os.path.join(old.dir, "data"), ignore_errors=True)
        self._start_node(old)
        self.wait_healthy()
        record.standby_ready = time.time()
        return record

    def keep_logs(self, folder: str) -> None:
        """Copy etcd's and each member's log into ``folder`` (the cluster's own go with it)."""
        for name in ("etcd", *(n.name for n in self.nodes)):
            with contextlib.suppress(OSError):
                shutil.copy(os.path.join(self.root, f"{name}.log"), os.path.join(folder, f"{name}.log"))

    def stop(self) -> None:
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.terminate()
                if node.link is not None:
                    node.link.resume()  # a cut member shuts down as others do
        for node in self.nodes:
            if node.process is not None:
                try:
                    node.process.wait(30)
                except subprocess.TimeoutExpired:
                    node.kill()
            for pid in node.postgres_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for node in self.nodes:
            node.drop_link()
        if self.etcd is not None:
            self.etcd.terminate()
            try:
                self.etcd.wait(10)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
        shutil.rmtree(self.root, ignore_errors=True)
