"""A private Redis Cluster for the tests: 3 masters and 3 replicas on free loopback ports.

Started once per test run (the ``redis_cluster`` session fixture in
``conftest.py``), from the Debian ``redis-server`` and ``redis-cli``, every
file in a temporary directory; stopped and removed at the end of the run.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Collection, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from django_tasklock.backends.base import storage_key
from django_tasklock.testing import BackendRecipe, ContractBackend
from tests.support.servers import require_binary

MASTERS = 3


def bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_ports() -> range:
    """The ports this machine hands out to outgoing connections (Linux; else its default)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    except (OSError, ValueError):
        return range(32768, 61000)
    return range(int(low), int(high) + 1)


def _free_node_port(taken: Collection[int] = ()) -> int:
    """A free port whose cluster bus port (port + 10000) is free too, both below 65536,
    and both below the ephemeral range when it leaves room: a node killed and
    started again on its port (tests/faults/test_cluster_kill.py) must find it
    free, not taken meanwhile by some process's outgoing connection.

    Neither is the port or the bus port of a node in ``taken``: those are free
    until their nodes start, and a port chosen twice made two nodes of one
    cluster share it (the second one's server could not bind, and the cluster
    never became ok).
    """
    ephemeral = _ephemeral_ports()
    below = ephemeral.start - 10000 > 10000
    avoided = {p for node in taken for p in (node, node + 10000)}
    while True:
        port = (
            random.randrange(10000, ephemeral.start - 10000)
            if below
            else random.randrange(20000, 40000)
        )
        if (
            port not in avoided
            and port + 10000 not in avoided
            and bindable(port)
            and bindable(port + 10000)
        ):
            return port


def _node_ports(count: int) -> list[int]:
    """``count`` ports for a cluster's nodes (:func:`_free_node_port`), none sharing a port."""
    ports: list[int] = []
    for _ in range(count):
        ports.append(_free_node_port(ports))
    return ports


class NodeDidNotStart(RuntimeError):
    """A node's ``redis-server`` exited, or did not answer on its port in time (its log in
    the message)."""


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 0.2):
            return True
    except OSError:
        return False


class PrivateCluster:
    """Six ``redis-server --cluster-enabled yes``, joined by ``redis-cli --cluster create``."""

    def __init__(self) -> None:
        self.server = require_binary(shutil.which("redis-server"), "redis-server")
        self.cli = require_binary(shutil.which("redis-cli"), "redis-cli")
        self.dir = Path(tempfile.mkdtemp(prefix="tasklock-cluster-"))
        self.ports = _node_ports(2 * MASTERS)
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self._nodes: dict[int, Any] = {}

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports[:2])

    def start_node(self, port: int) -> None:
        """Start the node on ``port``; :class:`NodeDidNotStart` (with its log) if it exits
        or does not listen within 20 s."""
        node_dir = self.dir / str(port)
        node_dir.mkdir(exist_ok=True)
        with open(node_dir / "log", "ab") as log:
            process = self.processes[port] = subprocess.Popen(
                [self.server, "--port", str(port), "--bind", "127.0.0.1",
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no",
                 "--repl-diskless-sync-delay", "0",
                 "--dir", str(node_dir), *self.node_options(port)],
                stdout=log, stderr=log,
            )  # fmt: skip
        end = time.monotonic() + 20
        while not _listening(port) or not self._serves(port, process):
            if process.poll() is not None or time.monotonic() > end:
                process.kill()
                process.wait(10)
                del self.processes[port]
                tail = (node_dir / "log").read_text(errors="replace")[-2000:]
                raise NodeDidNotStart(f"the cluster node on port {port} did not start:\n{tail}")
            time.sleep(0.05)

    def _serves(self, port: int, process: subprocess.Popen[bytes]) -> bool:
        """Whether the server listening on ``port`` is ``process``, not another process's
        (which had taken the port since it was found free)."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        probe = redis.Redis(
            port=port, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
        )
        try:
            return int(probe.info("server")["process_id"]) == process.pid
        except Exception:  # not answering yet, or not a Redis server
            return False
        finally:
            probe.close()

    def node_options(self, port: int) -> list[str]:
        """More ``redis-server`` options for the node on ``port``, after (and over) these."""
        return []

    def start(self) -> None:
        for index, port in enumerate(self.ports):
            for attempt in range(3):
                try:
                    self.start_node(port)
                    break
                except NodeDidNotStart:
                    # Its port (or its bus port, +10000) may have been taken
                    # since it was found free, by any process: another one.
                    if attempt == 2:
                        raise
                    port = self.ports[index] = _free_node_port(self.ports)
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        subprocess.run(
            [self.cli, "--cluster", "create", *nodes, "--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.wait_until_ok()

    def node(self, port: int) -> Any:
        """A plain client of the node on ``port`` (one per node, closed by :meth:`stop`)."""
        import redis

        if port not in self._nodes:
            self._nodes[port] = redis.Redis(port=port, socket_timeout=10)
        return self._nodes[port]

    def wait_until_ok(self, timeout: float = 60) -> None:
        """Until every node says ``cluster_state:ok``, every master has a replica in sync,
        and every node knows the others."""
        end = time.monotonic() + timeout
        seen = "nothing yet"
        while True:
            try:
                infos = [self.node(port).cluster("info") for port in self.processes]
                states = {info["cluster_state"] for info in infos}
                replicas = sum(
                    self.node(p).info("replication").get("master_link_status") == "up"
                    for p in self.processes
                )
                # Every node knows every other, connected, and which are replicas of whom
                # (a manual failover asks the master over the cluster bus).
                views = [self.node(p).cluster("nodes") for p in self.processes]
                agreed = all(
                    len(view) == len(self.processes)
                    and all(
                        node["connected"] or "myself" in node["flags"] for node in view.values()
                    )
                    and sum("slave" in node["flags"] for node in view.values()) == MASTERS
                    for view in views
                )
                if states == {"ok"} and replicas == MASTERS and agreed:
                    return
                seen = (
                    f"states {sorted(states)}, {replicas} replicas in sync, nodes known "
                    f"{[len(view) for view in views]} of {len(self.processes)}"
                )
            except Exception as error:  # a node still starting
                seen = repr(error)
            if time.monotonic() > end:
                raise TimeoutError(
                    f"the cluster in {self.dir} is not ok after {timeout} s (last seen: {seen})"
                )
            time.sleep(0.2)

    def client(self) -> Any:
        from redis.cluster import ClusterNode, RedisCluster

        nodes = [ClusterNode("127.0.0.1", p) for p in self.ports]  # type: ignore[no-untyped-call]
        return RedisCluster(startup_nodes=nodes)

    def slots_of(self, port: int) -> set[int]:
        """The slots the master on ``port`` serves, as it says itself."""
        owned: set[int] = set()
        for start, end, *nodes in self.node(port).execute_command("CLUSTER SLOTS"):
            if int(nodes[0][1]) == port:
                owned.update(range(int(start), int(end) + 1))
        return owned

    def masters(self) -> list[int]:
        return [p for p in self.processes if self.node(p).role()[0] in (b"master", "master")]

    def stop(self) -> None:
        for client in self._nodes.values():
            client.close()
        for process in self.processes.values():
            process.kill()
        for process in self.processes.values():
            process.wait(10)
        self.processes.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


def cluster_contract_backend(cluster: PrivateCluster, namespace: str) -> Iterator[ContractBackend]:
    """The Redis backend on ``cluster`` through a ``redis+cluster://`` URL, for the contract."""
    from django_tasklock.backends.redis import RedisBackend
    from django_tasklock.backends.redis.scripts import RELEASED_PREFIX
    from tests.conftest import skewed_worker

    client = cluster.client()

    def plant(stored: str, value: str, created_ago: timedelta, expires_in: timedelta) -> None:
        seconds, micros = client.get_node_from_key(stored).redis_connection.time()
        acquired_ms = seconds * 1000 + micros // 1000 - int(created_ago.total_seconds() * 1000)
        client.set(stored, f"{value}@{acquired_ms}", px=int(expires_in.total_seconds() * 1000))

    def written() -> set[str]:
        return {k.decode() for k in client.scan_iter(match=f"*{namespace}*")}

    recipe = BackendRecipe(
        backend="django_tasklock.backends.redis.RedisBackend",
        kwargs={"url": cluster.url},
        settings={"INSTALLED_APPS": ["django_tasklock"]},
    )
    yield ContractBackend(
        name="redis-cluster",
        backend=RedisBackend(url=cluster.url),
        recipe=recipe,
        plant=plant,
        put_foreign=lambda stored: client.set(stored, "not a lock"),
        # A release's tombstone is no lease: it outlives the lease by design.
        stored_keys=lambda: {k for k in written() if not k.startswith(RELEASED_PREFIX)},
        unreachable=lambda: RedisBackend(url="redis+cluster://127.0.0.1:1"),
        skew_worker_clock=skewed_worker(recipe),
    )
    for stored in written():
        client.delete(stored)
    client.close()


def one_key_per_master(client: Any, key: str) -> dict[int, str]:
    """A key (``key:<n>``) whose lease lives on each of three masters, by the master's port."""
    found: dict[int, str] = {}
    for i in range(1000):
        name = f"{key}:{i}"
        found.setdefault(client.get_node_from_key(storage_key(name)).port, name)
        if len(found) == 3:
            return found
    raise AssertionError("three masters, but keys reach fewer")
