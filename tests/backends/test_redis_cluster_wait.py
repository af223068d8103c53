"""On a Redis Cluster, the acknowledgement's ``WAIT`` goes to the node that owns the key.

redis-py's ``RedisCluster`` sends a keyless ``WAIT`` to its default node. A
smallest cluster shows the difference: two masters, only the second with a
replica. Whichever node is the client's default, a lease whose key lives on
the second master is confirmed, and one on the first (no replica) is not;
nor is one whose slot moved to the first while the client still sent it to
the second.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from django_tasklock import ReplicationNotConfirmed
from django_tasklock.api.service import new_token
from django_tasklock.backends.base import storage_key
from django_tasklock.backends.redis import RedisBackend
from tests.support import replication
from tests.support.servers import PrivateRedis, free_port, private_redis

CLUSTER_OPTIONS = ("--cluster-enabled", "yes", "--cluster-node-timeout", "5000")
LEASE = timedelta(seconds=30)
closing = replication.closing  # a fixture
Closing = Callable[[Any], Any]


def _until(condition: Any, what: str, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError(what)
        time.sleep(0.05)


@contextlib.contextmanager
def two_masters_one_replica() -> Iterator[tuple[PrivateRedis, PrivateRedis]]:
    """Masters ``first`` (slots 0-8191) and ``second`` (8192-16383); a replica of ``second``."""
    with contextlib.ExitStack() as stack:
        # The bus port would be port + 10000, beyond 65535 for a high free port.
        buses = [free_port() for _ in range(3)]
        first, second, replica = (
            stack.enter_context(private_redis(*CLUSTER_OPTIONS, "--cluster-port", str(bus)))
            for bus in buses
        )
        clients: list[Any] = [
            redis.Redis(port=server.port, decode_responses=True)
            for server in (first, second, replica)
        ]
        for client in clients:
            stack.callback(client.close)
        one, two, three = clients
        one.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 8191)
        two.execute_command("CLUSTER", "ADDSLOTSRANGE", 8192, 16383)
        for other, bus in ((second, buses[1]), (replica, buses[2])):
            one.execute_command("CLUSTER", "MEET", "127.0.0.1", other.port, bus)
        _until(lambda: len(three.execute_command("CLUSTER", "NODES").splitlines()) == 3, "meet")
        _until(
            lambda: (
                two.execute_command("CLUSTER", "MYID") in three.execute_command("CLUSTER", "NODES")
            ),
            "gossip",
        )
        three.execute_command("CLUSTER", "REPLICATE", two.execute_command("CLUSTER", "MYID"))
        for client in (one, two, three):
            _until(lambda c=client: c.cluster("info")["cluster_state"] == "ok", "cluster_state:ok")

        def second_is_replicated() -> bool:
            two.incr("{a}sync")  # slot 15495: a write on the second master
            return int(two.wait(1, 100)) >= 1

        _until(second_is_replicated, "the replica never acknowledged")
        yield first, second


def _key_on(client: Any, low: int, high: int) -> str:
    """A fresh caller's key whose lease key is in slots ``low`` to ``high``."""
    prefix = uuid.uuid4().hex[:8]
    for n in range(100_000):  # pragma: no branch - half of all keys qualify
        key = f"cluster-wait-{prefix}-{n}"
        if low <= client.keyslot(storage_key(key)) <= high:
            return key
    raise AssertionError("no key found")  # pragma: no cover


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[PrivateRedis, PrivateRedis]]:
    with two_masters_one_replica() as running:
        yield running


@pytest.mark.parametrize("default", ["first", "second"])
def test_wait_is_sent_to_the_node_that_owns_the_lease(
    cluster: tuple[PrivateRedis, PrivateRedis], default: str, closing: Closing
) -> None:
    first, second = cluster
    client: Any = closing(RedisCluster(host="127.0.0.1", port=first.port))
    chosen = first if default == "first" else second
    client.set_default_node(client.get_node(host="127.0.0.1", port=chosen.port))
    backend = RedisBackend(client=client, min_replicas=1, replica_timeout=0.3)
    on_second, on_first = _key_on(client, 8192, 16383), _key_on(client, 0, 8191)
    assert backend.acquire(on_second, new_token(), ttl=LEASE, max_lifetime=LEASE)
    with pytest.raises(ReplicationNotConfirmed) as raised:
        backend.acquire(on_first, new_token(), ttl=LEASE, max_lifetime=LEASE)
    assert raised.value.confirmed == 0
    assert raised.value.released  # its tombstone is in its slot: no CROSSSLOT
    assert client.exists(storage_key(on_first)) == 0
    client.close()


def test_a_slot_moved_during_the_call_is_confirmed_where_the_lease_landed(
    cluster: tuple[PrivateRedis, PrivateRedis], closing: Closing
) -> None:
    # The client believes the slot is on the second master (replicated); it
    # has moved to the first (no replica). The script follows MOVED there on
    # another connection, while the WAIT, sent to the second master, counts
    # its replica: that count must not confirm the lease.
    first = cluster[0]
    client: Any = closing(RedisCluster(host="127.0.0.1", port=first.port))
    backend = RedisBackend(client=client, min_replicas=1, replica_timeout=0.3)
    key = _key_on(client, 8192, 16383)
    slot = client.keyslot(storage_key(key))
    nodes: list[Any] = [closing(redis.Redis(port=s.port, decode_responses=True)) for s in cluster]
    one, two = nodes
    first_id = one.execute_command("CLUSTER", "MYID")
    for node in (two, one):  # the owner gives it up first
        node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", first_id)
    with pytest.raises(ReplicationNotConfirmed) as raised:
        backend.acquire(key, new_token(), ttl=LEASE, max_lifetime=LEASE)
    assert raised.value.confirmed == 0
    # It landed on the first master, and was released there.
    assert raised.value.released
    assert one.exists(storage_key(key)) == 0


def test_a_slot_being_migrated_is_confirmed_where_the_lease_landed(
    cluster: tuple[PrivateRedis, PrivateRedis], closing: Closing
) -> None:
    # The slot is being migrated from the second master (replicated) to the
    # first (no replica): the second answers ASK for a key it does not have,
    # and the lease lands on the first. A WAIT on the second's connection,
    # where nothing was written, counts its replica at once: that count must
    # not confirm the lease.
    first = cluster[0]
    client: Any = closing(RedisCluster(host="127.0.0.1", port=first.port))
    backend = RedisBackend(client=client, min_replicas=1, replica_timeout=0.3)
    key = _key_on(client, 8192, 16383)
    slot = client.keyslot(storage_key(key))
    nodes: list[Any] = [closing(redis.Redis(port=s.port, decode_responses=True)) for s in cluster]
    one, two = nodes
    one_id, two_id = (node.execute_command("CLUSTER", "MYID") for node in nodes)
    one.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", two_id)
    two.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", one_id)
    try:
        with pytest.raises(ReplicationNotConfirmed) as raised:
            backend.acquire(key, new_token(), ttl=LEASE, max_lifetime=LEASE)
        assert raised.value.confirmed == 0
        assert raised.value.released  # by its token, on the first master (ASK again)
        pipe = one.pipeline(transaction=False)
        pipe.execute_command("ASKING")
        pipe.exists(storage_key(key))
        assert pipe.execute()[1] == 0
    finally:
        for node in (one, two):
            node.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
