"""A master that sees the cluster down (``CLUSTERDOWN``), as masters do during a failover.

While a slot has no master answering for it (its master failed, no replica
promoted yet), a master that sees it so answers every command ``CLUSTERDOWN
The cluster is down``, while others may still serve theirs. Here one master
is made to see the cluster that way for real: it forgets one slot of its own
(``CLUSTER DELSLOTS``; the other nodes still map the slot to it, so they stay
``ok``), and takes it back at the end (``CLUSTER ADDSLOTS``). On the test
run's private cluster (``tests/support/cluster.py``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ClusterDownError
from redis.retry import Retry

from django_tasklock.api.service import new_token
from django_tasklock.backends.base import PartlyRefreshed, Refresh, Released, storage_key
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.backends.redis.slots import key_slot
from tests.support.cluster import PrivateCluster, one_key_per_master

TTL = timedelta(seconds=60)


@contextlib.contextmanager
def sees_the_cluster_down(
    cluster: PrivateCluster, port: int, spare: set[int]
) -> Iterator[Callable[[], None]]:
    """The master on ``port`` sees the cluster down; yields ``heal()``, which ends it early.

    The slot it forgets is one of its own not in ``spare`` (the tests' keys stay served).
    """
    node = cluster.node(port)
    slot = min(cluster.slots_of(port) - spare)
    healed = threading.Event()

    def heal() -> None:
        if not healed.is_set():
            node.execute_command("CLUSTER ADDSLOTS", slot)
            healed.set()

    node.execute_command("CLUSTER DELSLOTS", slot)
    try:
        end = time.monotonic() + 30
        while node.cluster("info")["cluster_state"] != "fail":
            assert time.monotonic() < end, "the master never saw the cluster down"
            time.sleep(0.01)
        yield heal
    finally:
        heal()
        cluster.wait_until_ok()


def _clusterdown_replies(node: Any) -> int:
    return int(node.info("errorstats").get("errorstat_CLUSTERDOWN", {}).get("count", 0))


def test_a_master_answering_clusterdown_fails_only_its_own_leases_refreshes(
    redis_cluster: PrivateCluster, key: str
) -> None:
    backend = RedisBackend(url=redis_cluster.url)
    names = one_key_per_master(backend._conn(), key)
    items = {port: Refresh(name, new_token(), TTL, TTL) for port, name in names.items()}
    for item in items.values():
        assert backend.acquire(item.key, item.token, ttl=TTL, max_lifetime=TTL)
    down = next(iter(items))
    spare = {key_slot(storage_key(name)) for name in names.values()}
    try:
        with (
            sees_the_cluster_down(redis_cluster, down, spare),
            pytest.raises(PartlyRefreshed) as raised,
        ):
            backend.refresh_many(list(items.values()))
        assert raised.value.answers == [None if port == down else True for port in items]
        assert isinstance(raised.value.__cause__, ClusterDownError)
        assert backend.refresh_many(list(items.values())) == [True, True, True]
    finally:
        for item in items.values():
            backend.release(item.key, item.token)
        backend._conn().close()


def test_a_release_refused_with_clusterdown_is_an_error_and_sent_again_ends_the_lease(
    redis_cluster: PrivateCluster, key: str
) -> None:
    # The master is healed as soon as it has refused the release, before
    # redis-py (told not to retry) gives up on it 0.25 s later: a fallback
    # sent then would be served. The release sent again must find the lease
    # (RELEASED), and once more its tombstone (GONE): never LOST.
    nodes = [ClusterNode("127.0.0.1", p) for p in redis_cluster.ports]  # type: ignore[no-untyped-call]
    client = RedisCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 0))
    backend = RedisBackend(client=client)
    token = new_token()
    assert backend.acquire(key, token, ttl=TTL, max_lifetime=TTL)
    port = client.get_node_from_key(storage_key(key)).port  # type: ignore[no-untyped-call]
    node = redis_cluster.node(port)
    try:
        with sees_the_cluster_down(redis_cluster, port, {key_slot(storage_key(key))}) as heal:
            refusals = _clusterdown_replies(node)

            def heal_after_the_refusal() -> None:
                end = time.monotonic() + 30
                while _clusterdown_replies(node) == refusals and time.monotonic() < end:
                    time.sleep(0.005)
                heal()

            healer = threading.Thread(target=heal_after_the_refusal)
            healer.start()
            first: Released | None = None
            try:
                first = backend.release_outcome(key, token)
            except ClusterDownError:
                pass  # an error: the lock logs it, and the lease ends after its ttl
            finally:
                healer.join()
        again = backend.release_outcome(key, token)
        assert again is (Released.GONE if first else Released.RELEASED)  # never LOST
        assert first is None, "a release refused with CLUSTERDOWN was sent without its tombstone"
        assert backend.release_outcome(key, token) is Released.GONE
        assert backend.peek(key) is None
    finally:
        backend.release(key, token)
        client.close()
