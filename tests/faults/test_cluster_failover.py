"""A manual failover (``CLUSTER FAILOVER`` on a replica) under held locks on a Redis Cluster.

The replica takes over its master's slots once it has caught up, so no lease
is lost; the old master turns replica and answers ``MOVED`` for them, which
redis-py follows. Holders keep refreshing, take fences and release; a lease
written on the new master is ours again if its acquisition is sent twice.
(A master *killed* before replicating can lose leases: docs/guarantees.md.)
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from django_tasklock import current_lock
from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.base import storage_key
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.backends.redis.slots import key_slot
from tests.support.cluster import PrivateCluster

pytestmark = pytest.mark.slow

LONG = timedelta(seconds=5)
LIFE = timedelta(minutes=1)


def _replica_of(cluster: PrivateCluster, master: int) -> int:
    for port in cluster.processes:
        role = cluster.node(port).role()
        if role[0] in (b"slave", "slave") and int(role[2]) == master:
            return port
    raise AssertionError(f"no replica of {master}")


def _fail_over_to(cluster: PrivateCluster, replica: int) -> None:
    """``CLUSTER FAILOVER`` on ``replica``, asked again if it times out (5 s in Redis)."""
    for _ in range(3):
        cluster.node(replica).execute_command("CLUSTER FAILOVER")
        end = time.monotonic() + 10
        while time.monotonic() < end:
            if cluster.node(replica).role()[0] in (b"master", "master"):
                return
            time.sleep(0.1)
    raise AssertionError("the failover never happened")


def test_a_manual_failover_under_held_locks_keeps_them(
    redis_cluster: PrivateCluster, key: str
) -> None:
    names = [f"{key}:{i}" for i in range(12)]
    backend = RedisBackend(url=redis_cluster.url)
    service = TaskLockService(backend)
    raw = redis_cluster.client()
    master = raw.get_node_from_key(storage_key(names[0])).port
    replica = _replica_of(redis_cluster, master)
    failed_over = threading.Event()
    started = threading.Barrier(len(names) + 1)
    kept: list[str] = []
    errors: list[BaseException] = []

    def hold(name: str) -> None:
        def body() -> None:
            lock = current_lock()
            assert lock is not None
            started.wait(30)
            failed_over.wait(60)
            time.sleep(2)  # refreshes on the new master
            if not lock.lost:
                kept.append(name)

        try:
            result = service.run_exclusive(name, body, ttl=5, refresh_interval=0.3, fencing=True)
            assert result.acquired
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=hold, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    started.wait(30)
    try:
        time.sleep(0.5)
        _fail_over_to(redis_cluster, replica)
        failed_over.set()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert sorted(kept) == sorted(names)
        token = new_token()
        assert backend.acquire(names[0], token, ttl=LONG, max_lifetime=LIFE)
        assert backend.acquire(names[0], token, ttl=LONG, max_lifetime=LIFE)  # sent again: ours
        assert key_slot(storage_key(names[0])) in redis_cluster.slots_of(replica)
        assert backend.release(names[0], token)
    finally:
        failed_over.set()
        raw.delete(*(storage_key(name) for name in names))
        raw.close()
        backend._conn().close()
        redis_cluster.wait_until_ok()
