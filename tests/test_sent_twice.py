"""Every lock call sent twice has the outcome of sending it once.

A reply lost after the storage acted makes the call go out again: the
database backend re-sends a release (or a force release's deletion) on a new
connection, and redis-py retries a command whose connection broke. Through a
:class:`FaultProxy` that lets the request through and drops the connection
before the reply arrives, on PostgreSQL, MariaDB and Redis.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from django.conf import settings

from django_tasklock.backends.base import BaseBackend, lease_id, storage_key
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.service import new_token
from django_tasklock.testing.proxy import FaultProxy
from django_tasklock.testing.support import LIFE, LONG, wait_until
from tests.proxied import PROXIED, proxied_backend, statement_of, upstream

pytestmark = pytest.mark.databases


@pytest.fixture(params=PROXIED)
def storage(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def proxy(storage: str) -> Iterator[FaultProxy]:
    with FaultProxy(upstream(storage), lifetime=120) as running:
        yield running


@pytest.fixture
def direct(storage: str, key: str) -> Iterator[BaseBackend]:
    """The same storage, not through the proxy: the other workers."""
    if storage != "redis":
        yield DatabaseBackend(using=storage)
        return
    import redis

    from django_tasklock.backends.redis import RedisBackend

    assert settings.REDIS_URL is not None
    yield RedisBackend(url=settings.REDIS_URL)
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(*[stored for stored in client.scan_iter(match=storage_key(key) + "*")] or [key])


def a_write_of(storage: str, backend: BaseBackend, key: str) -> Callable[[bytes], bool]:
    """The request that deletes ``key``: a DELETE, or any Redis command on it but a look."""
    if storage != "redis":
        return lambda data: b"DELETE" in data
    inspect = statement_of(storage, backend, "inspect", b"")
    stored = storage_key(key).encode()
    return lambda data: stored in data and inspect not in data


# -- 1. force release ------------------------------------------------------------


def test_force_release_whose_reply_was_lost_never_ends_the_successors_lease(
    storage: str, proxy: FaultProxy, direct: BaseBackend, key: str
) -> None:
    first, successor = new_token(), new_token()
    with proxied_backend(storage, proxy) as operator:
        assert direct.acquire(key, first, ttl=LONG, max_lifetime=LIFE)
        deletion = a_write_of(storage, operator, key)
        proxy.drop_reply(match=deletion)
        proxy.delay(2.0, match=deletion)  # the re-send waits while a successor takes the key
        took: list[bool] = []

        def successor_takes() -> None:
            try:
                wait_until(lambda: proxy.dropped == 1, timeout=20)
                took.append(direct.acquire(key, successor, ttl=LONG, max_lifetime=LIFE))
            finally:
                direct.close()  # this thread's connection

        thread = threading.Thread(target=successor_takes)
        thread.start()
        released = operator.force_release(key)
        thread.join(30)
    assert took == [True], "the first deletion did not happen, or the successor could not take"
    assert (proxy.dropped, proxy.delayed) == (1, 1), "the deletion was not sent twice"
    held = direct.peek(key)
    assert held is not None, "the re-sent deletion ended the successor's lease"
    assert held.lease == lease_id(successor)
    assert direct.refresh(key, successor, ttl=LONG, max_lifetime=LIFE)
    # The lease the operator's call ended is named, although its reply was lost.
    assert released, "a force release that ended the lease said it ended nothing"
    assert released.lease == lease_id(first)
    assert direct.release(key, successor)
