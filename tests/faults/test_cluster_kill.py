"""A Redis Cluster master killed under load, its replica promoted by the cluster: granted twice?

tests/support/cluster.py's cluster (3 masters, 3 replicas), an instance of its own (a
kill damages it), with a node timeout of 200 ms: the cluster itself declares
a killed master failed and elects its replica, in about 1.3 s. Each node
announces a :class:`FaultProxy` in front of it, through which its replica
replicates; the clients map the announced addresses back (redis-py's
``address_remap``) and reach the masters directly, as in
tests/faults/test_redis_failover.py, whose trial this is, on a cluster:

Eight threads acquire fresh keys of one shard (its master's slots) as fast as
they can, four with ``min_replicas=1`` and four without; at a random moment
the master's replication link stops forwarding (``blackhole``: what was in
flight is lost, as when the master's host dies) and the master is killed
(``SIGKILL``). Once the cluster has promoted the replica, a contender tries
every key the master granted. A contender that gets one is a **double
grant**: two workers told "acquired" for one key while the first lease still
had most of its 60 s to run. The killed node is started again and rejoins as
its successor's replica; the next trial kills the next shard's master.

In 100 trials (kills): 0 double grants with acknowledgement; without it,
leases granted twice (a run's figures are in docs/guarantees.md).
"""

from __future__ import annotations

import itertools
import random
import shutil
import threading
import time
import uuid
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

import pytest
from redis.exceptions import ClusterDownError

from django_tasklock.api.service import new_token
from django_tasklock.backends.base import storage_key
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.backends.redis.slots import key_slot
from django_tasklock.backends.redis.urls import TIMEOUT_S
from django_tasklock.testing.proxy import FaultProxy
from tests.support.cluster import NodeDidNotStart, PrivateCluster, bindable
from tests.support.replication import Trial, summary

pytestmark = pytest.mark.slow

TRIALS = 100
THREADS = 4
LEASE = timedelta(seconds=60)
NODE_TIMEOUT_MS = 200
SETTLE_S = 30  # for a promotion, or a replica to catch up


def _role(node: Any) -> tuple[str, int | None]:
    """``("master", None)``, or ``("slave", the port of its master, as announced)``."""
    role = node.role()
    name = role[0].decode() if isinstance(role[0], bytes) else role[0]
    return name, int(role[2]) if name == "slave" else None


def _until(condition: Any, what: str) -> None:
    end = time.monotonic() + SETTLE_S
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"{what}, after {SETTLE_S} s")
        time.sleep(0.02)


class KillableCluster(PrivateCluster):
    """A :class:`PrivateCluster` whose replication links go through proxies, one per node.

    ``shards`` are the three slot ranges; ``masters_of[i]`` is the node serving ``shards[i]``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.proxies: dict[int, FaultProxy] = {}  # by the node's port
        self.real: dict[int, int] = {}  # the node's port, by its proxy's
        for port in self.ports:
            self._proxy(port)
        self.shards: list[range] = []
        self.masters_of: list[int] = []

    def _proxy(self, port: int) -> FaultProxy:
        """The proxy in front of the node on ``port``, started on first use: a node that
        ``start`` moved to a new port (its own was taken meanwhile) gets one then."""
        proxy = self.proxies.get(port)
        if proxy is None:
            taken = {p for node in (*self.ports, port) for p in (node, node + 10000)}
            proxy = FaultProxy(("127.0.0.1", port), lifetime=3600)
            while proxy.port in taken:  # a node's port, or its cluster bus port
                proxy.stop()
                proxy = FaultProxy(("127.0.0.1", port), lifetime=3600)
            self.proxies[port] = proxy.start()
            self.real[proxy.port] = port
        return proxy

    def node_options(self, port: int) -> list[str]:
        return [
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--cluster-announce-port", str(self._proxy(port).port),
            "--cluster-announce-bus-port", str(port + 10000),
        ]  # fmt: skip

    def start(self) -> None:
        super().start()
        for start, end, master, *_ in sorted(
            self.node(self.ports[0]).execute_command("CLUSTER SLOTS")
        ):
            self.shards.append(range(int(start), int(end) + 1))
            self.masters_of.append(self.real[int(master[1])])

    def refresh_masters(self) -> None:
        """``masters_of`` as the masters say (had the cluster failed one over by itself)."""
        slots = self.node(self.masters_of[0]).execute_command("CLUSTER SLOTS")
        owners = {int(start): self.real[int(master[1])] for start, _, master, *_ in slots}
        self.masters_of = [owners[shard.start] for shard in self.shards]

    def remap(self, address: tuple[str, int]) -> tuple[str, int]:
        host, port = address
        return host, self.real.get(port, port)

    def client(self) -> Any:
        """A client as a ``redis+cluster://`` URL makes (no retries), to the nodes directly."""
        from redis.backoff import NoBackoff
        from redis.cluster import ClusterNode, RedisCluster
        from redis.retry import Retry

        nodes = [ClusterNode("127.0.0.1", p) for p in self.masters_of]  # type: ignore[no-untyped-call]
        return RedisCluster(
            startup_nodes=nodes,
            address_remap=self.remap,
            socket_timeout=TIMEOUT_S,
            socket_connect_timeout=TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),
        )

    def replica_of(self, master: int) -> int:
        announced = self.proxies[master].port
        for port in self.processes:
            if _role(self.node(port)) == ("slave", announced):
                return port
        raise AssertionError(f"no replica of {master}")

    def wait_until_replicated(self, shard: int) -> None:
        """Until a write on the shard's master is acknowledged by a replica (``WAIT``)."""
        master = self.node(self.masters_of[shard])
        key = next(
            k for n in itertools.count() if key_slot(k := f"sync-{n}") in self.shards[shard]
        )

        def acknowledged() -> bool:
            try:
                master.incr(key)
            except ClusterDownError:  # the cluster still settling: not yet, not a failure
                return False
            return int(master.wait(1, 100)) >= 1

        _until(acknowledged, f"no replica of shard {shard} acknowledged a write")

    def kill(self, port: int) -> None:
        """The node's host dies: its replication links stop forwarding, then ``SIGKILL``."""
        self.proxies[port].blackhole()
        process = self.processes.pop(port)
        process.kill()
        process.wait(10)
        self.proxies[port].heal()  # for the node started again

    def restart(self, port: int) -> None:
        """Start the killed node again on its own port (where its proxy forwards).

        Should the port (or its bus port) be held for a moment by another
        process's socket, the start is tried again once both are free.
        """
        for attempt in range(3):
            try:
                self.start_node(port)
                return
            except NodeDidNotStart:
                if attempt == 2:
                    raise
                _until(
                    lambda: bindable(port) and bindable(port + 10000),
                    f"ports {port} and {port + 10000} are still taken",
                )

    def fail_over(self, shard: int, replica: int) -> None:
        """Until the cluster promoted ``replica`` and every node says ``cluster_state:ok``."""

        def promoted() -> bool:
            states = {self.node(p).cluster("info")["cluster_state"] for p in self.processes}
            return _role(self.node(replica))[0] == "master" and states == {"ok"}

        _until(promoted, f"the cluster never promoted {replica}")
        self.masters_of[shard] = replica

    def stop(self) -> None:
        super().stop()
        for proxy in self.proxies.values():
            proxy.stop()


class Load:
    """``THREADS`` threads acquiring fresh keys of ``slots`` with one backend, until it fails."""

    def __init__(self, backend: RedisBackend, slots: range, dead: threading.Event) -> None:
        self.backend, self.slots, self.dead = backend, slots, dead
        self.prefix = f"cluster-kill-{uuid.uuid4().hex[:8]}"
        self.granted: list[str] = []
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(n,)) for n in range(THREADS)]
        for thread in self.threads:
            thread.start()

    def _run(self, worker: int) -> None:
        names = (f"{self.prefix}-{worker}-{n}" for n in itertools.count())
        for key in (k for k in names if key_slot(storage_key(k)) in self.slots):
            try:
                if self.backend.acquire(key, new_token(), ttl=LEASE, max_lifetime=LEASE):
                    self.granted.append(key)
            except Exception as exc:
                if not self.dead.is_set():
                    self.errors.append(exc)
                return

    def join(self) -> None:
        for thread in self.threads:
            thread.join(30)
        assert not self.errors, f"before the kill: {self.errors[0]!r}"


def trial(
    cluster: KillableCluster, clients: list[Any], shard: int, rng: random.Random
) -> tuple[Trial, Trial]:
    """The shard's master killed under load; the keys it granted, tried on its successor.

    Two loads at once, one with ``min_replicas=1`` and one without: one kill
    is a trial of each. Their keys are their own, and a ``WAIT`` waits for
    the replica to reach its own connection's last write, whatever the other
    load writes. ``clients``: the two loads' and the contender's, made once
    (a new ``RedisCluster`` sends ``COMMAND``), told the layout again here.
    """
    # The cluster as a whole first (the master killed last time rejoined as a
    # replica, and a loaded machine can keep its nodes from agreeing for a while):
    # waited for, never assumed.
    cluster.wait_until_ok()
    cluster.refresh_masters()
    cluster.wait_until_replicated(shard)
    master = cluster.masters_of[shard]
    replica = cluster.replica_of(master)
    dead = threading.Event()
    acked, unacked, contender = (
        RedisBackend(client=client, min_replicas=n, replica_timeout=2)
        for client, n in zip(clients, (1, 0, 0), strict=True)
    )
    for client in clients[:2]:
        client.nodes_manager.initialize()  # the layout since the last kill
    loads = [Load(backend, cluster.shards[shard], dead) for backend in (acked, unacked)]
    end = time.monotonic() + 10
    while time.monotonic() < end and not all(
        len(load.granted) >= THREADS or load.errors for load in loads
    ):
        time.sleep(0.001)  # the loads are running
    time.sleep(rng.uniform(0.0, 0.05))
    dead.set()
    cluster.kill(master)
    for load in loads:
        load.join()
    cluster.fail_over(shard, replica)
    clients[2].nodes_manager.initialize()
    with_ack, without = (
        Trial(
            len(load.granted),
            sum(
                contender.acquire(key, new_token(), ttl=LEASE, max_lifetime=LEASE)
                for key in load.granted
            ),
        )
        for load in loads
    )
    cluster.restart(master)  # it rejoins, the replica of its successor
    return with_ack, without


@pytest.fixture(scope="module")
def kills() -> tuple[list[Trial], list[Trial]]:
    """``TRIALS`` kills, the shards in turn: the trials with, and without, acknowledgement."""
    cluster = KillableCluster()
    with ExitStack() as running:
        running.callback(cluster.stop)
        cluster.start()
        clients = [running.enter_context(cluster.client()) for _ in range(3)]
        rng = random.Random(19)
        shards = len(cluster.shards)
        results = [trial(cluster, clients, n % shards, rng) for n in range(TRIALS)]
    with_ack, without = ([r[i] for r in results] for i in (0, 1))
    print(f"with acknowledgement: {summary(with_ack)}; without: {summary(without)}")
    return with_ack, without


def test_with_replica_acknowledgement_no_lease_is_granted_twice(
    kills: tuple[list[Trial], list[Trial]],
) -> None:
    with_ack = kills[0]
    assert all(r.granted >= THREADS for r in with_ack)
    assert sum(r.doubled for r in with_ack) == 0, summary(with_ack)


def test_without_it_a_failover_grants_leases_twice(
    kills: tuple[list[Trial], list[Trial]],
) -> None:
    # The same kills find double grants when nothing waits for the replica:
    # the harness can see what the test above asserts never happens.
    without = kills[1]
    assert all(r.granted >= THREADS for r in without)
    assert sum(r.doubled for r in without) > 0, summary(without)


def test_a_node_started_on_a_new_port_gets_a_proxy_of_its_own() -> None:
    # PrivateCluster.start() moves a node whose port was taken meanwhile to a new one;
    # its options named the proxy of the first port (KeyError before).
    killable = KillableCluster()
    try:
        moved = max(killable.ports) + 1
        options = killable.node_options(moved)
        announced = int(options[options.index("--cluster-announce-port") + 1])
        assert killable.real[announced] == moved
        assert announced not in {p for node in killable.ports for p in (node, node + 10000)}
    finally:
        killable.stop()
        shutil.rmtree(killable.dir, ignore_errors=True)
