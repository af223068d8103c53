"""Redis fencing tokens across the loss of their counters: a restart, a ``FLUSHDB``.

A fence must be greater than every fence handed out before for that key,
or a paused holder's stale fence would win over the live holder's at the
protected resource. Restarts and flushes happen on a private Redis
(``tests/support/servers.py``); the shared one is never restarted nor flushed.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis

from django_tasklock.backends.redis import RedisBackend
from django_tasklock.backends.redis.scripts import fence_key
from django_tasklock.leases.lease import new_token
from tests.support.servers import PrivateRedis, private_redis

pytestmark = pytest.mark.slow
LONG, LIFE = timedelta(seconds=30), timedelta(hours=1)


@pytest.fixture
def server() -> Iterator[PrivateRedis]:
    with private_redis() as running:
        yield running


def _granted_fence(backend: RedisBackend, key: str) -> int:
    """Acquire ``key``, take its fence, release it."""
    token = new_token()
    assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
    fence = backend.fence(key, token)
    assert fence is not None
    assert backend.release(key, token)
    return fence


def _strictly_increasing(fences: list[int]) -> bool:
    return fences == sorted(set(fences))


def test_fences_keep_growing_across_a_restart_without_persistence(
    server: PrivateRedis, key: str
) -> None:
    backend = RedisBackend(url=server.url)
    fences = [_granted_fence(backend, key) for _ in range(5)]
    server.stop()
    server.start()  # the same port, nothing remembered
    fences += [_granted_fence(backend, key) for _ in range(3)]
    assert _strictly_increasing(fences), fences


def test_fences_keep_growing_across_a_flush_of_the_lock_database(
    server: PrivateRedis, key: str
) -> None:
    backend = RedisBackend(url=server.url)
    client = redis.Redis.from_url(server.url)
    fences = [_granted_fence(backend, key) for _ in range(5)]
    client.flushdb()
    fences += [_granted_fence(backend, key)]
    client.delete(fence_key(key))  # the counter alone, as an eviction would
    fences += [_granted_fence(backend, key) for _ in range(3)]
    assert _strictly_increasing(fences), fences


def test_a_paused_holders_fence_loses_to_the_live_holders_after_a_restart(
    server: PrivateRedis, key: str
) -> None:
    backend = RedisBackend(url=server.url)
    for _ in range(4):
        _granted_fence(backend, key)
    paused = new_token()  # fenced, then paused (GC, a stopped VM) while Redis restarts
    assert backend.acquire(key, paused, ttl=LONG, max_lifetime=LIFE)
    stale = backend.fence(key, paused)
    assert stale is not None
    server.stop()
    server.start()
    live = new_token()
    assert backend.acquire(key, live, ttl=LONG, max_lifetime=LIFE)
    fresh = backend.fence(key, live)
    assert fresh is not None
    # The resource keeps the greatest fence it has seen: the live holder's write must win.
    assert fresh > stale, (stale, fresh)
