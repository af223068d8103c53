"""Backends whose every call goes through a :class:`FaultProxy` (tests/test_sent_twice*.py).

The fixtures ``storage`` (each of :data:`PROXIED`), ``proxy`` and ``direct``
(the same storage, not proxied) are imported by the tests that use them.

A database alias ``<alias>_proxied`` is registered for the calling thread
only: the test database's settings with the proxy's host and port (the
wrapper keeps the name ``<alias>``, which the test may use). Other threads,
the heartbeat's included, do not see it: tests keep their calls in one
thread. A Redis backend gets a hand-built ``redis.Redis(host, port, db)``
client at the proxy, which retries a command whose connection broke (10 times, by
redis-py 8's defaults): a lost reply is sent again by the client, as it is in
production with such a client.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.db import connections

from django_tasklock.backends.base import BaseBackend, storage_key
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.backends.database.connections import add_thread_connection
from django_tasklock.testing.proxy import FaultProxy
from tests.conftest import require_service

#: The backends a reply can be lost on (a TCP connection between), by fixture name.
PROXIED = ["postgres", "mariadb", "redis"]


def upstream(name: str) -> tuple[str, int]:
    """Where the storage ``name`` listens."""
    require_service(name)
    if name == "redis":
        assert settings.REDIS_URL is not None
        parts = urlsplit(settings.REDIS_URL)
        return parts.hostname or "127.0.0.1", parts.port or 6379
    database = connections[name].settings_dict
    return database["HOST"] or "127.0.0.1", int(database["PORT"])


@contextmanager
def proxied_backend(name: str, proxy: FaultProxy) -> Iterator[BaseBackend]:
    """A backend of storage ``name`` whose connections all go through ``proxy``."""
    if name == "redis":
        import redis

        from django_tasklock.backends.redis import RedisBackend

        assert settings.REDIS_URL is not None
        db = int(urlsplit(settings.REDIS_URL).path.strip("/") or "0")
        client = redis.Redis(host=proxy.host, port=proxy.port, db=db, socket_timeout=10)
        assert client.get_retry().get_retries() > 0, "this client must retry"  # type: ignore[union-attr]
        yield RedisBackend(client=client)
        client.close()
        return
    alias = f"{name}_proxied"
    add_thread_connection(
        alias,
        {**connections[name].settings_dict, "HOST": proxy.host, "PORT": str(proxy.port)},
        alias=name,
    )
    try:
        yield DatabaseBackend(using=alias)
    finally:
        try:
            connections[alias].close()
        finally:
            del connections[alias]


def statement_of(name: str, backend: BaseBackend, script: str, sql: bytes) -> bytes:
    """What identifies a request on the wire: a script's SHA (Redis), else SQL text."""
    if name == "redis":
        scripts = backend._calls()  # type: ignore[attr-defined]
        # Loaded now, so that the request matched is the script's run, not a NOSCRIPT.
        scripts.load()
        sha: str = scripts.shas[script]
        return sha.encode()
    return sql


@pytest.fixture(params=PROXIED)
def storage(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def proxy(storage: str) -> Iterator[FaultProxy]:
    # The fixture stops the proxy; its lifetime only bounds a leaked one. It outlasts the
    # volume test's own bound (600 s): with 120 s, a loaded run of 10,000 operations on
    # PostgreSQL outlasted the proxy, and every later call met a refused connection.
    with FaultProxy(upstream(storage), lifetime=600) as running:
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
