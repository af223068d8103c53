"""One master of the cluster not answering: the leases of the others are still refreshed.

The master is made to hold every script for a few seconds (``CLIENT PAUSE …
WRITE``: it stays in the cluster, no failover), and the client's socket
timeout is short, so its pipeline fails with a timeout while the other
masters answer. ``refresh_many`` answers their leases (``PartlyRefreshed``);
the heartbeat keeps them, and only the paused master's lease, unrefreshed
past its ``ttl``, is lost. On the test run's private cluster (``tests/support/cluster.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from redis.cluster import ClusterNode, RedisCluster

from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.base import PartlyRefreshed, Refresh
from django_tasklock.backends.redis import RedisBackend
from tests.support.cluster import PrivateCluster, one_key_per_master


@pytest.fixture
def client(redis_cluster: PrivateCluster) -> Iterator[Any]:
    nodes = [ClusterNode("127.0.0.1", p) for p in redis_cluster.ports]  # type: ignore[no-untyped-call]
    client = RedisCluster(startup_nodes=nodes, socket_timeout=0.5)
    yield client
    client.close()


def _pause(cluster: PrivateCluster, port: int, seconds: float) -> None:
    cluster.node(port).execute_command("CLIENT", "PAUSE", int(seconds * 1000), "WRITE")


def test_a_master_that_does_not_answer_leaves_the_others_refreshed(
    redis_cluster: PrivateCluster, client: Any, key: str
) -> None:
    backend = RedisBackend(client=client)
    names = one_key_per_master(client, key)
    ttl = timedelta(seconds=60)
    items = {port: Refresh(name, new_token(), ttl, ttl) for port, name in names.items()}
    for item in items.values():
        assert backend.acquire(item.key, item.token, ttl=ttl, max_lifetime=ttl)
    paused = next(iter(items))
    _pause(redis_cluster, paused, 3)
    try:
        with pytest.raises(PartlyRefreshed) as raised:
            backend.refresh_many(list(items.values()))
    finally:
        redis_cluster.node(paused).execute_command("CLIENT", "UNPAUSE")
    assert raised.value.answers == [None if port == paused else True for port in items]
    assert backend.refresh_many(list(items.values())) == [True, True, True]  # answering again
    for item in items.values():
        assert backend.release(item.key, item.token)


def test_the_heartbeat_keeps_the_leases_of_the_masters_that_answer(
    redis_cluster: PrivateCluster, client: Any, key: str
) -> None:
    backend = RedisBackend(client=client)
    service = TaskLockService(backend)
    calls: list[int] = []  # leases per refresh_many call
    original = backend.refresh_many

    def counted(items: Any) -> list[bool]:
        calls.append(len(items))
        return original(items)

    backend.refresh_many = counted  # type: ignore[method-assign]
    names = one_key_per_master(client, key)
    paused = next(iter(names))
    # A ttl between two ticks: unanswered three times, a lease is past its deadline.
    locks = {port: service.lock(name, ttl=3.5, refresh_interval=1) for port, name in names.items()}
    for held in locks.values():
        assert held.acquire()
    try:
        _pause(redis_cluster, paused, 7)  # twice the ttl: every tick meets it
        time.sleep(7.5)
        redis_cluster.node(paused).execute_command("CLIENT", "UNPAUSE")
        lost = {port for port, held in locks.items() if held.lost}
        assert lost == {paused}, calls  # unrefreshed past its ttl; the others were refreshed
        assert 3 in calls  # the three leases in one call: the master paused and two that answer
    finally:
        redis_cluster.node(paused).execute_command("CLIENT", "UNPAUSE")
        for held in locks.values():
            held.release()


def test_scripts_are_loaded_again_while_another_master_does_not_answer(
    redis_cluster: PrivateCluster, key: str
) -> None:
    # A master that lost its scripts (a replica just promoted) answers
    # NOSCRIPT; the scripts are loaded on every master that answers, and the
    # call goes on, whatever another master does meanwhile. ``ALL``: ``SCRIPT
    # LOAD`` waits too (a paused node takes no command, not even ``UNPAUSE``).
    backend = RedisBackend(url=redis_cluster.url + "?socket_timeout=0.5")
    client = backend._conn()
    names = one_key_per_master(client, key)
    paused, flushed = list(names)[:2]
    redis_cluster.node(flushed).script_flush()
    token = new_token()
    ttl = timedelta(seconds=60)
    redis_cluster.node(paused).execute_command("CLIENT", "PAUSE", 2000, "ALL")
    try:
        assert backend.acquire(names[flushed], token, ttl=ttl, max_lifetime=ttl)
    finally:
        redis_cluster.node(paused).ping()  # answered once the pause is over
    assert backend.release(names[flushed], token)
    client.close()
