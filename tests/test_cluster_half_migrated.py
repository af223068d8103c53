"""Releases while a lease's slot is half migrated (``MIGRATING``/``IMPORTING``, keys split).

Redis Cluster runs a script with several keys in a slot being migrated only
when the node has all of them; otherwise it answers ``TRYAGAIN`` for as long as
the migration lasts. A release's tombstone key never exists before the
release, so the two-key release script is refused on both nodes: the release
must still end the lease, not leave the key held until its ``ttl`` runs out.
On the test run's private cluster (``tests/cluster.py``); the slot is made
stable again at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from django_tasklock.backends.base import Released, storage_key
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.backends.redis.slots import key_slot
from django_tasklock.service import new_token
from tests.cluster import PrivateCluster

TTL = timedelta(minutes=5)


@pytest.fixture
def half_migrated(redis_cluster: PrivateCluster, key: str) -> Iterator[tuple[Any, Any, int]]:
    """The slot of ``{key}`` keys marked migrating to another master: (source, target, slot)."""
    slot = key_slot(storage_key(f"{{{key}}}"))
    masters = redis_cluster.masters()
    source_port = next(p for p in masters if slot in redis_cluster.slots_of(p))
    source = redis_cluster.node(source_port)
    target = redis_cluster.node(next(p for p in masters if p != source_port))
    ids = [node.execute_command("CLUSTER MYID") for node in (source, target)]
    target.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[0])
    source.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[1])
    try:
        yield source, target, slot
    finally:
        for node in (source, target):  # whatever this test left in the slot
            for stored in node.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
                pipe = node.pipeline(transaction=False)
                pipe.execute_command("ASKING")  # on the target, served only after ASKING
                pipe.delete(stored)
                pipe.execute()
        for node in (target, source):
            node.execute_command("CLUSTER SETSLOT", slot, "STABLE")


def test_a_lease_released_while_its_slot_is_half_migrated_is_released(
    redis_cluster: PrivateCluster, half_migrated: tuple[Any, Any, int], key: str
) -> None:
    source, target, _ = half_migrated
    backend = RedisBackend(url=redis_cluster.url)
    staying, moved = f"{{{key}}}staying", f"{{{key}}}moved"
    tokens = {name: new_token() for name in (staying, moved)}
    for name, token in tokens.items():
        assert backend.acquire(name, token, ttl=TTL, max_lifetime=TTL)
    port = target.connection_pool.connection_kwargs["port"]
    source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", storage_key(moved))

    for name, token in tokens.items():  # one on each node
        assert backend.release_outcome(name, token) is Released.RELEASED, name
        assert backend.peek(name) is None
        assert backend.acquire(name, new_token(), ttl=TTL, max_lifetime=TTL), name
