"""Releases (and acquisitions) while a lease's slot is half migrated (``MIGRATING``/``IMPORTING``).

Redis Cluster runs a script with several keys in a slot being migrated only
when the node has all of them; otherwise it answers ``TRYAGAIN`` for as long as
the migration lasts. A release's tombstone key never exists before the
release, so the two-key release script is refused on both nodes: the release
must still end the lease, not leave the key held until its ``ttl`` runs out.
On the test run's private cluster (``tests/support/cluster.py``); the slot is made
stable again at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from django_tasklock.api.service import new_token
from django_tasklock.backends.base import Refresh, Released, storage_key
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.backends.redis.scripts import tombstone_key
from django_tasklock.backends.redis.slots import key_slot
from tests.support.cluster import PrivateCluster

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


@pytest.fixture
def backend(redis_cluster: PrivateCluster) -> Iterator[RedisBackend]:
    made = RedisBackend(url=redis_cluster.url)
    yield made
    made._conn().close()


def test_a_lease_released_while_its_slot_is_half_migrated_is_released(
    redis_cluster: PrivateCluster,
    half_migrated: tuple[Any, Any, int],
    backend: RedisBackend,
    key: str,
) -> None:
    source, target, _ = half_migrated
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


def test_an_acquisition_in_a_half_migrated_slot_is_refused_only_to_a_released_token(
    redis_cluster: PrivateCluster,
    half_migrated: tuple[Any, Any, int],
    backend: RedisBackend,
    key: str,
) -> None:
    # The acquisition names its token's tombstone too, which does not exist:
    # refused (TRYAGAIN) on both nodes, it is sent again on the lease's key
    # alone, after a look at the tombstone. One a release left (before the
    # migration; moved already) still refuses its token: a late acquisition.
    _, target, _ = half_migrated
    name, released = f"{{{key}}}late", new_token()
    pipe = target.pipeline(transaction=False)
    pipe.execute_command("ASKING")
    pipe.set(tombstone_key(name, released), released, px=60_000)
    pipe.execute()

    assert not backend.acquire(name, released, ttl=TTL, max_lifetime=TTL)
    assert backend.peek(name) is None, "a late acquisition wrote a lease nobody holds"
    assert backend.acquire(name, new_token(), ttl=TTL, max_lifetime=TTL)


def test_a_refresh_meeting_a_half_migrated_slot_answers_every_lease(
    redis_cluster: PrivateCluster,
    half_migrated: tuple[Any, Any, int],
    backend: RedisBackend,
    key: str,
) -> None:
    # A lease lost in the slot (its key gone) makes the slot's one script name
    # a key the node lacks: TRYAGAIN for as long as the migration lasts. The
    # other leases, of that slot and of others, must still be refreshed and
    # answered, the lost one answered lost.
    kept, lost, elsewhere = f"{{{key}}}kept", f"{{{key}}}lost", f"{key}-elsewhere"
    assert key_slot(storage_key(elsewhere)) != half_migrated[2]
    items = [Refresh(name, new_token(), TTL, TTL) for name in (kept, lost, elsewhere)]
    for item in items:
        assert backend.acquire(item.key, item.token, ttl=timedelta(seconds=30), max_lifetime=TTL)
    # Taken during the migration, both live on the target; one is lost (its key gone).
    pipe = half_migrated[1].pipeline(transaction=False)
    pipe.execute_command("ASKING")
    pipe.delete(storage_key(lost))
    assert pipe.execute()[1] == 1

    assert backend.refresh_many(items) == [True, False, True]
    assert backend.refresh_many(items[:2]) == [True, False]  # one script: no pipeline
    for item in (items[0], items[2]):
        held = backend.peek(item.key)
        assert held is not None
        assert held.seconds_left > 60  # refreshed to the 5 min ttl


def test_a_fenced_acquisition_in_a_half_migrated_slot_is_an_error_never_held(
    redis_cluster: PrivateCluster,
    half_migrated: tuple[Any, Any, int],
    backend: RedisBackend,
    key: str,
) -> None:
    # The new lease is written on the target; its fence counter is on neither
    # node: the fence script is refused (TRYAGAIN) until the move ends. The
    # acquisition fails with that error, and the lock leaves the key free.
    from redis.exceptions import RedisError

    from django_tasklock.api.service import TaskLockService

    name = f"{{{key}}}fenced"
    with pytest.raises(RedisError):
        TaskLockService(backend).run_exclusive(name, lambda: None, fencing=True)
    assert backend.peek(name) is None
