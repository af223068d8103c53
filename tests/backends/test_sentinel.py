"""Locks through Redis Sentinel, and across a forced failover.

A master, a replica and a sentinel run on loopback ports (``tests/support/servers.py``).
The backend reaches the master through django-redis's Sentinel client or a
``redis+sentinel://`` ``TASKLOCK_REDIS_URL``. Redis replicates asynchronously:
a lease written just before a failover can be missing on the new master. The
holder then either keeps its lease (it was replicated) or is told it lost it —
never neither; fencing tokens protect the resource in the second case.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_tasklock import current_lock
from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.base import storage_key
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.signals import lock_lost
from tests.support.servers import PrivateSentinel, private_sentinel

pytestmark = pytest.mark.slow


@pytest.fixture
def sentinel() -> Iterator[PrivateSentinel]:
    with private_sentinel() as running:
        yield running


@pytest.fixture(params=["url", "django-redis"])
def backend(request: pytest.FixtureRequest, sentinel: PrivateSentinel) -> Iterator[RedisBackend]:
    if request.param == "url":
        yield RedisBackend(url=sentinel.url)
        return
    cache = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://{sentinel.service}/0",
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "SENTINELS": [("127.0.0.1", sentinel.port)],
        },
    }
    with override_settings(
        CACHES={"default": cache},
        DJANGO_REDIS_CONNECTION_FACTORY="django_redis.pool.SentinelConnectionFactory",
    ):
        yield RedisBackend(cache_alias="default")


def test_locks_work_through_sentinel_and_survive_a_failover_or_say_they_did_not(
    sentinel: PrivateSentinel, backend: RedisBackend, key: str
) -> None:
    service = TaskLockService(backend)
    assert service.run_exclusive(key, lambda: "before").result == "before"
    lost: list[str] = []
    seen: dict[str, Any] = {}

    def on_lost(sender: object, key: str, **kwargs: object) -> None:
        lost.append(key)

    def work() -> None:
        assert sentinel.master_port() == sentinel.master.port
        assert not service.run_exclusive(key, lambda: None).acquired  # held, through sentinel
        time.sleep(0.5)  # let the lease replicate
        sentinel.client().execute_command("SENTINEL", "FAILOVER", sentinel.service)
        end = time.monotonic() + 20
        while sentinel.master_port() != sentinel.replica.port:
            assert time.monotonic() < end, "the failover never happened"
            time.sleep(0.1)
        time.sleep(2)  # refreshes after the failover, on the new master
        new_master = redis.Redis(port=sentinel.replica.port)
        seen["value"] = new_master.get(storage_key(key))
        if seen["value"] is None:
            # The old master confirms refreshes until Sentinel demotes it (it
            # reconfigures a deposed master that still claims the role some
            # seconds after the failover), and none reaches the new one: the
            # holder is told one ttl after the demotion at the latest, when a
            # refresh answered READONLY sends the client to the new master.
            lock = current_lock()
            assert lock is not None
            old_master = redis.Redis(port=sentinel.master.port)
            demoted = time.monotonic() + 60
            while old_master.info("replication")["role"] != "slave":
                assert time.monotonic() < demoted, "Sentinel never demoted the old master"
                time.sleep(0.1)
            told = time.monotonic() + 3 + 2  # the ttl, and two seconds for a loaded machine
            while not lock.lost and time.monotonic() < told:
                time.sleep(0.05)

    lock_lost.connect(on_lost, weak=False)
    try:
        result = service.run_exclusive(key, work, ttl=3, refresh_interval=0.5)
    finally:
        lock_lost.disconnect(on_lost)
    assert result.acquired
    if result.lost:
        sent = time.monotonic() + 2  # the notifier thread sends lock_lost
        while lost != [key] and time.monotonic() < sent:
            time.sleep(0.02)
        assert lost == [key]
    else:
        assert lost == []
        assert seen["value"] is not None, "kept a lease the new master does not have"
    # Locks keep working on the new master.
    assert service.run_exclusive(key, lambda: "after").result == "after"


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel:///mymaster",
        "redis+sentinel://127.0.0.1:26379/",
        "redis+sentinel://127.0.0.1/mymaster",
        "redis+sentinel://127.0.0.1:26379/mymaster/zero",
    ],
)
def test_a_malformed_sentinel_url_says_how_it_reads(url: str) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from django_tasklock.backends.redis.urls import client_from_url

    with pytest.raises(ImproperlyConfigured, match="TASKLOCK_REDIS_URL"):
        client_from_url(url)


def test_a_sentinel_url_authenticates_as_its_acl_user(sentinel: PrivateSentinel, key: str) -> None:
    master: Any = redis.Redis(port=sentinel.master.port)
    master.execute_command("ACL", "SETUSER", "tasklock", "on", ">s3cret", "~*", "+@all")
    url = f"redis+sentinel://tasklock:s3cret@127.0.0.1:{sentinel.port}/{sentinel.service}/0"
    backend = RedisBackend(url=url)
    assert TaskLockService(backend).run_exclusive(key, lambda: "ran").result == "ran"
    assert backend._conn().acl_whoami() == "tasklock"


def test_a_sentinel_url_honours_its_query_options(sentinel: PrivateSentinel) -> None:
    from django_tasklock.backends.redis.urls import client_from_url

    client: Any = client_from_url(sentinel.url + "?socket_timeout=1&client_name=tl-sentinel")
    assert client.client_getname() == "tl-sentinel"
    assert client.connection_pool.connection_kwargs["socket_timeout"] == 1.0
    asked = client.connection_pool.sentinel_manager.sentinels[0]
    assert asked.connection_pool.connection_kwargs["socket_timeout"] == 1.0
    # These servers speak no TLS: a client that honours ?ssl=true cannot talk to them.
    with pytest.raises(redis.ConnectionError):
        client_from_url(sentinel.url + "?ssl=true").ping()
