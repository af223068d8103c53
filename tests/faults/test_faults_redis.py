"""Redis faults while a lock is held: a restart without persistence, foreign key types.

Restarts happen on a private Redis (``tests/support/servers.py``); the shared one is
never restarted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings

from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.base import storage_key
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.signals import lock_lost
from django_tasklock.testing.support import wait_until
from tests.conftest import require_service
from tests.support.servers import PrivateRedis, private_redis

pytestmark = pytest.mark.slow
LONG, LIFE = 30.0, 3600.0


@pytest.fixture
def server() -> Iterator[PrivateRedis]:
    with private_redis() as running:
        yield running


def test_restart_without_persistence_is_a_loss_that_is_never_recreated(
    server: PrivateRedis, key: str
) -> None:
    backend = RedisBackend(url=server.url)
    client = redis.Redis.from_url(server.url)
    lost: list[str] = []

    def on_lost(sender: object, key: str, **kwargs: object) -> None:
        lost.append(key)

    def work() -> None:
        assert client.exists(storage_key(key))
        server.stop()
        server.start()  # the same port, nothing remembered
        wait_until(lambda: bool(lost), timeout=5)
        time.sleep(1)  # more intervals: nothing may write the key again
        assert not client.exists(storage_key(key))

    lock_lost.connect(on_lost, weak=False)
    try:
        result = TaskLockService(backend).run_exclusive(key, work, ttl=1, refresh_interval=0.2)
    finally:
        lock_lost.disconnect(on_lost)
    assert result.lost
    assert lost == [key]
    # The restarted server had no scripts: they were loaded again on first use.
    again = TaskLockService(backend).run_exclusive(key, lambda: "again", ttl=1)
    assert (again.acquired, again.result, again.lost) == (True, "again", False)


def test_a_foreign_hash_at_our_key_is_held_or_taken_over_never_a_stuck_heartbeat(
    key: str,
) -> None:
    require_service("redis")
    url = settings.REDIS_URL
    assert url is not None
    client, backend = redis.Redis.from_url(url), RedisBackend(url=url)
    ttl, life = timedelta(seconds=LONG), timedelta(seconds=LIFE)
    stored = storage_key(key)
    try:
        # With a TTL it blocks the key like any lease we cannot date, until it expires.
        client.hset(stored, "field", "value")
        client.pexpire(stored, 30_000)
        assert not backend.acquire(key, new_token(), ttl=ttl, max_lifetime=life)
        held = backend.peek(key)
        assert held is not None
        assert held.holder.pid is None
        assert key in [lock.key for lock in backend.list()]
        assert not backend.refresh(key, new_token(), ttl=ttl, max_lifetime=life)
        assert not backend.release(key, new_token())
        terms: dict[str, Any] = {"limit": 2, "ttl": ttl, "max_lifetime": life}
        assert backend.acquire_permit(key, new_token(), **terms) is None  # not our permits
        assert client.type(stored) == b"hash"
        assert client.hgetall(stored) == {b"field": b"value"}
        # Without a TTL it could never expire: it is abandoned, and taken over.
        client.persist(stored)
        token = new_token()
        assert backend.acquire(key, token, ttl=ttl, max_lifetime=life)
        assert backend.refresh(key, token, ttl=ttl, max_lifetime=life)
        assert backend.release(key, token)
    finally:
        client.delete(stored)


@pytest.mark.parametrize(
    "value",
    [
        "someone@" + "9" * 30,  # an acquisition time past any date
        "someone@" + "9" * 400,  # past a Lua number: inf
        "host:12:secret@99999999999999",  # our format, a time past the year 9999
    ],
)
def test_a_foreign_value_with_an_absurd_time_is_listed_as_unknown(value: str, key: str) -> None:
    require_service("redis")
    url = settings.REDIS_URL
    assert url is not None
    client, backend = redis.Redis.from_url(url), RedisBackend(url=url)
    stored = storage_key(key)
    try:
        client.set(stored, value, px=30_000)
        held = backend.peek(key)
        assert held is not None
        assert held.holder.pid is None
        assert 0 < held.seconds_left <= 30
        assert held.acquired_at <= held.expires_at
        assert key in [lock.key for lock in backend.list()]
        assert not backend.acquire(
            key, new_token(), ttl=timedelta(seconds=LONG), max_lifetime=timedelta(seconds=LIFE)
        )
    finally:
        client.delete(stored)
