"""The Redis heartbeat at 10,000 leases on a real Redis Cluster: one script per slot.

The scripts are counted by the masters themselves (``INFO commandstats``),
or, where one client's are counted, on that client's wire. Speed is measured
in ``bench/cluster.py``, never here.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from typing import Any

import redis

from django_tasklock.api.service import new_token
from django_tasklock.backends.base import Refresh, storage_key
from django_tasklock.backends.redis import RedisBackend
from tests.backends.test_cluster import backend, raw, slot
from tests.support.cluster import PrivateCluster

__all__ = ["backend", "raw"]  # fixtures of test_cluster, used here

LONG = timedelta(minutes=5)
LIFE = timedelta(hours=1)


def _evalsha_calls(cluster: PrivateCluster) -> int:
    total = 0
    for port in cluster.masters():
        stats = cluster.node(port).info("commandstats")
        total += int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return total


class _CountingConnection(redis.Connection):
    """A connection that counts the ``EVALSHA`` commands it sends, on the wire.

    Every command a client sends, through ``execute_command``, a pipeline or
    the backend's lean path, goes through ``send_packed_command``.
    """

    evalsha = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        chunks = [command] if isinstance(command, (bytes, str)) else command
        data = b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)
        type(self).evalsha += data.count(b"\r\n$7\r\nEVALSHA\r\n")
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


def test_ten_thousand_leases_refresh_in_one_script_per_slot_and_500_keys(
    redis_cluster: PrivateCluster, backend: RedisBackend, raw: Any, key: str
) -> None:
    """What one heartbeat tick sends for 10,000 leases: counted by the masters themselves."""
    # 9,000 keys spread over the slots, 1,000 sharing one hash tag: one slot, two scripts.
    names = [f"{key}:{i}" for i in range(9_000)] + [f"{{{key}}}:{i}" for i in range(1_000)]
    tokens = [new_token() for _ in names]
    scripts = backend._calls()
    acquired = scripts.run_many(
        [
            ("acquire", [storage_key(n)], [t, 300_000, 86_400_000])
            for n, t in zip(names, tokens, strict=True)
        ]
    )
    assert acquired == [1] * len(names)
    per_slot = Counter(slot(storage_key(name)) for name in names)
    expected = sum(-(-count // 500) for count in per_slot.values())
    assert per_slot[slot(storage_key(f"{{{key}}}:0"))] >= 1_000  # more than 500: two scripts

    before = _evalsha_calls(redis_cluster)
    answers = backend.refresh_many(
        [Refresh(n, t, LONG, LIFE) for n, t in zip(names, tokens, strict=True)]
        + [Refresh(names[0], "not-the-token", LONG, LIFE)]
    )
    assert _evalsha_calls(redis_cluster) - before == expected
    assert answers == [True] * len(names) + [False]  # one answer per lease, in order
    for start in range(0, len(names), 500):
        raw.delete(*(storage_key(n) for n in names[start : start + 500]))


def test_the_heartbeat_holding_ten_thousand_leases_sends_one_script_per_slot_per_tick(
    redis_cluster: PrivateCluster, backend: RedisBackend, raw: Any, key: str
) -> None:
    """Through the process's heartbeat: each tick's scripts, counted by the masters."""
    from django_tasklock.backends.base import Holder
    from django_tasklock.leases.heartbeat import heartbeat
    from django_tasklock.leases.lease import Lease, clock
    from django_tasklock.locking.options import LockOptions

    names = [f"{key}:{i}" for i in range(10_000)]
    tokens = [new_token() for _ in names]
    options = LockOptions.resolve(ttl=30, refresh_interval=1)
    asked_at = clock()
    assert backend._calls().run_many(
        [
            ("acquire", [storage_key(n)], [t, 30_000, 86_400_000])
            for n, t in zip(names, tokens, strict=True)
        ]
    ) == [1] * len(names)
    ticks: list[tuple[int, int]] = []  # of most leases: (scripts the masters ran, expected)
    original = backend.refresh_many

    def counted(items: Any) -> list[bool]:
        before = _evalsha_calls(redis_cluster)
        answers = original(items)
        per_slot = Counter(slot(storage_key(item.key)) for item in items)
        if len(items) > len(names) // 2:  # not a tick while the leases were being added
            ticks.append(
                (
                    _evalsha_calls(redis_cluster) - before,
                    sum(-(-n // 500) for n in per_slot.values()),
                )
            )
        return answers

    backend.refresh_many = counted  # type: ignore[method-assign]
    leases = [
        Lease(backend, n, t, Holder.from_token(t), options, asked_at=asked_at)
        for n, t in zip(names, tokens, strict=True)
    ]
    for lease in leases:
        heartbeat().add(lease)
    try:
        end = time.monotonic() + 60
        while len(ticks) < 2:
            assert time.monotonic() < end, "the heartbeat did not tick twice in 60 s"
            time.sleep(0.1)
    finally:
        for lease in leases:  # a tick under way is waited for: its scripts are not counted next
            heartbeat().remove(lease, wait=True)
    assert [sent for sent, _ in ticks[:2]] == [expected for _, expected in ticks[:2]]
    assert 3_000 < ticks[0][0] < 10_000  # one script per slot, not per 500 leases (20)
    assert not any(lease.lost for lease in leases)
    for start in range(0, len(names), 500):
        raw.delete(*(storage_key(n) for n in names[start : start + 500]))


def _names_on(redis_cluster: PrivateCluster, port: int, prefix: str) -> list[str]:
    """40 names or more, ``prefix:<n>``, in at least 5 slots, all of the master at ``port``."""
    owned = redis_cluster.slots_of(port)
    names: list[str] = []
    i = 0
    while len({slot(storage_key(n)) for n in names}) < 5 or len(names) < 40:
        name = f"{prefix}:{i}"
        if slot(storage_key(name)) in owned:
            names.append(name)
        i += 1
    return names


def test_a_plain_client_refused_crossslot_sends_per_slot_from_then_on(
    redis_cluster: PrivateCluster, key: str
) -> None:
    """A proxy in front of a cluster hides it: a plain client to one master stands in.

    A single Redis takes 500 keys of any slots in one script (test_statements);
    one that refuses them (``CROSSSLOT``, before running anything) gets them
    per slot from then on, and every lease is still answered.
    """
    port = redis_cluster.masters()[0]
    names = _names_on(redis_cluster, port, key)
    tokens = [new_token() for _ in names]
    node = redis.Redis(
        connection_pool=redis.ConnectionPool(
            port=port, socket_timeout=10, connection_class=_CountingConnection
        )
    )
    backend = RedisBackend(client=node)
    try:
        for name, token in zip(names, tokens, strict=True):
            assert backend.acquire(name, token, ttl=LONG, max_lifetime=LIFE)
        assert not backend._calls().per_slot
        items = [Refresh(n, t, LONG, LIFE) for n, t in zip(names, tokens, strict=True)]
        assert backend.refresh_many(items) == [True] * len(names)
        assert backend._calls().per_slot
        # Counted on this client's wire, not by the master: another test's
        # heartbeat may refresh leases of the same cluster meanwhile.
        before = _CountingConnection.evalsha
        assert backend.refresh_many(items) == [True] * len(names)
        slots = {slot(storage_key(n)) for n in names}
        assert _CountingConnection.evalsha - before == len(slots)
    finally:
        for name in names:
            node.delete(storage_key(name))
        node.connection_pool.disconnect()


def test_a_reap_on_a_plain_client_refused_crossslot_looks_per_slot(
    redis_cluster: PrivateCluster, key: str
) -> None:
    """The reap's scripts take 500 keys each; one master seen as a plain Redis refuses
    keys of two slots (``CROSSSLOT``): from then on they go per slot, and every key of
    this machine found is answered (here, leases of a live holder: none reaped)."""
    port = redis_cluster.masters()[0]
    names = _names_on(redis_cluster, port, f"{key}:reap")
    node = redis.Redis(connection_pool=redis.ConnectionPool(port=port, socket_timeout=10))
    backend = RedisBackend(client=node)
    try:
        for name in names:
            assert backend.acquire(name, new_token(), ttl=LONG, max_lifetime=LIFE)
        assert not backend._calls().per_slot
        assert backend.reap_dead_holders() == []
        assert backend._calls().per_slot
        assert backend.reap_dead_holders() == []
        assert all(backend.peek(name) is not None for name in names)
    finally:
        for name in names:
            node.delete(storage_key(name))
        node.connection_pool.disconnect()
