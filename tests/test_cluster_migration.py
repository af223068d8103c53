"""A hash slot migrated (``CLUSTER SETSLOT … MIGRATING/IMPORTING`` + ``MIGRATE``) under held locks.

While the slot moves, its keys are split between two masters: a script whose
keys are all gone from the source gets ``ASK``, one whose keys are split gets
``TRYAGAIN``, and once the slot is handed over, ``MOVED``. Holders refresh
(one script for all of them: their keys share the slot), take fencing tokens
and release; contenders try to take the same keys the whole time. Every
holder keeps its lease or is told it lost it, and no two hold one key at once.
Intervals are timed by the host's clock, which is every node's (one machine).
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from django_tasklock import current_lock
from django_tasklock.backends.base import storage_key
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.backends.redis.slots import key_slot
from django_tasklock.service import TaskLockService
from tests.cluster import PrivateCluster
from tests.volume_workers import Interval, overlaps

pytestmark = pytest.mark.slow

HOLDERS = 20


def migrate_slot(cluster: PrivateCluster, raw: Any, slot: int, batch: int = 4) -> tuple[int, int]:
    """Move ``slot`` to another master, ``batch`` keys at a time with pauses; (from, to) ports."""
    masters = cluster.masters()
    source = next(p for p in masters if slot in cluster.slots_of(p))
    target = next(p for p in masters if p != source)
    src, dst = cluster.node(source), cluster.node(target)
    src_id, dst_id = src.execute_command("CLUSTER MYID"), dst.execute_command("CLUSTER MYID")
    dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
    while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, batch):
        src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
        time.sleep(0.1)  # the slot split between two masters: ASK and TRYAGAIN meanwhile
    for port in masters:
        cluster.node(port).execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
    return source, target


def test_a_slot_migrated_under_held_locks_keeps_each_lease_or_says_it_was_lost(
    redis_cluster: PrivateCluster, key: str
) -> None:
    names = [f"{{{key}}}:{i}" for i in range(HOLDERS)]  # one slot for all
    slot = key_slot(storage_key(names[0]))
    backend = RedisBackend(url=redis_cluster.url)
    service = TaskLockService(backend)
    raw = redis_cluster.client()
    migrated = threading.Event()
    all_held = threading.Barrier(HOLDERS + 1)
    intervals: dict[str, list[Interval]] = {name: [] for name in names}
    told_lost: list[str] = []
    kept: list[str] = []
    fences: dict[str, list[int]] = {name: [] for name in names}
    errors: list[BaseException] = []

    def hold(name: str) -> None:
        def body() -> None:
            entry = time.time()
            lock = current_lock()
            assert lock is not None
            assert lock.fence is not None
            fences[name].append(lock.fence)  # while held: in the order of the grants
            all_held.wait(30)
            while not migrated.is_set() and not lock.lost:
                time.sleep(0.05)
            if not lock.lost:
                time.sleep(2)  # refreshes after the hand-over: MOVED, then the new master
            end = time.time()
            intervals[name].append((entry, end))
            if lock.lost:
                told_lost.append(name)
            else:
                assert backend.peek(name) is not None
                kept.append(name)

        try:
            result = service.run_exclusive(name, body, ttl=5, refresh_interval=0.3, fencing=True)
            assert result.acquired
            assert result.fence is not None
        except BaseException as exc:
            errors.append(exc)

    stop = threading.Event()

    def contend() -> None:
        rng = random.Random()
        while not stop.is_set():
            name = rng.choice(names)

            def body(name: str = name) -> None:
                entry = time.time()
                lock = current_lock()
                assert lock is not None
                assert lock.fence is not None
                fences[name].append(lock.fence)  # while held: in the order of the grants
                intervals[name].append((entry, time.time()))

            try:
                result = service.run_exclusive(name, body, ttl=5, fencing=True)
                if result.acquired:
                    assert result.fence is not None
            except BaseException as exc:
                errors.append(exc)

    holders = [threading.Thread(target=hold, args=(name,)) for name in names]
    for thread in holders:
        thread.start()
    all_held.wait(30)
    contenders = [threading.Thread(target=contend) for _ in range(3)]
    for thread in contenders:
        thread.start()
    time.sleep(0.5)
    source, target = migrate_slot(redis_cluster, raw, slot)
    migrated.set()
    for thread in holders:
        thread.join(60)
    time.sleep(0.5)  # contenders take the keys, now on the new master
    stop.set()
    for thread in contenders:
        thread.join(60)
    try:
        assert errors == []
        assert sorted(kept + told_lost) == sorted(names)
        assert slot in redis_cluster.slots_of(target)
        assert redis_cluster.node(source).execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0
        for name in names:
            assert overlaps(intervals[name]) == [], name
            assert len(intervals[name]) >= 2, f"{name}: no contender took it after the holder"
            assert fences[name] == sorted(fences[name]), name  # the counter moved along
    finally:
        raw.delete(*(storage_key(name) for name in names))
        raw.close()
        backend._conn().close()


def test_a_pipelined_refresh_after_a_slot_moved_follows_it(
    redis_cluster: PrivateCluster, key: str
) -> None:
    """The backend's client still maps the slot to its old master: MOVED, then sent again."""
    from datetime import timedelta

    from django_tasklock.backends.base import Refresh
    from django_tasklock.service import new_token

    names = [f"{{{key}}}:{i}" for i in range(5)] + [f"{key}:other:{i}" for i in range(20)]
    backend = RedisBackend(url=redis_cluster.url)
    token = new_token()
    long, life = timedelta(minutes=5), timedelta(hours=1)
    assert all(backend.acquire(name, token, ttl=long, max_lifetime=life) for name in names)
    raw = redis_cluster.client()
    slot = key_slot(storage_key(names[0]))
    try:
        migrate_slot(redis_cluster, raw, slot)
        items = [Refresh(name, token, long, life) for name in names]
        assert backend.refresh_many(items) == [True] * len(names)  # one call per slot: pipelined
        assert {lock.key for lock in backend.list()} >= set(names)
        assert all(backend.release(name, token) for name in names)
    finally:
        raw.delete(*(storage_key(name) for name in names))
        raw.close()
        backend._conn().close()
