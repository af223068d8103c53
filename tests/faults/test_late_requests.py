"""Requests that arrive late, on Redis: after their own re-send was answered, even the release.

redis-py gives a command up after its socket timeout and sends it again on a
new connection; the first copy may still reach Redis later, and nobody reads
its reply. A late acquisition or refresh must never recreate or extend a
lease its token already ended (``min_hold`` included), and a re-sent release
that its own first copy ended is no loss, whoever holds the key now.

On one Redis, through a :class:`FaultProxy` that holds the first copy back
until the test lets it go (the client, with a 0.5 s socket timeout, has sent
it again meanwhile). On the private Redis Cluster, the late copy is the same
script call (same keys, same arguments) sent again on a raw client once the
lock is done with it: what the node sees of a late copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings

from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.base import Refresh, Released, lease_id, storage_key
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.backends.redis.scripts import tombstone_key
from django_tasklock.signals import lock_lost, lock_released
from django_tasklock.testing.proxy import FaultProxy
from django_tasklock.testing.support import LIFE, LONG, SignalRecorder, wait_until
from tests.conftest import require_service
from tests.support.cluster import PrivateCluster
from tests.support.proxied import statement_of, upstream

#: Shorter than the ttl (30 s), so that a lease a late refresh extended is told from a cut one.
MIN_HOLD = timedelta(seconds=20)

pytestmark = pytest.mark.databases


def forget(client: Any, key: str, *tokens: str) -> None:
    """Delete the lease of ``key`` and the tombstones of ``tokens``, wherever they are."""
    for stored in (storage_key(key), *(tombstone_key(key, token) for token in tokens)):
        client.delete(stored)


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    with FaultProxy(upstream("redis"), lifetime=120) as running:
        yield running


@pytest.fixture
def late(proxy: FaultProxy) -> Iterator[RedisBackend]:
    """The Redis backend through ``proxy``, on a client that gives a command up after
    0.5 s and sends it again on a new connection (as ``redis.Redis(...)`` does, without
    its backoff between tries)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    assert settings.REDIS_URL is not None
    db = int(urlsplit(settings.REDIS_URL).path.strip("/") or "0")
    client = redis.Redis(
        host=proxy.host, port=proxy.port, db=db, socket_timeout=0.5, retry=Retry(NoBackoff(), 3)
    )
    yield RedisBackend(client=client)
    client.close()


@pytest.fixture
def direct() -> Iterator[RedisBackend]:
    """The same Redis, not through the proxy: the other workers, and the test's eyes."""
    require_service("redis")  # a skip naming the variable on a machine without Redis
    assert settings.REDIS_URL is not None
    backend = RedisBackend(url=settings.REDIS_URL)
    yield backend
    backend._conn().close()


def held_back(proxy: FaultProxy, backend: RedisBackend, script: str, key: str) -> Any:
    """Hold the next run of ``script`` on ``key`` back; the event that lets it go."""
    sha, stored = statement_of("redis", backend, script, b""), storage_key(key).encode()
    return proxy.hold(match=lambda data: sha in data and stored in data)


def arrives_late(proxy: FaultProxy, let_go: Any) -> None:
    """Let the held copy go, once its re-send was answered; return when Redis has run it."""
    assert (proxy.delayed, proxy.delivered) == (1, 0), "the request was not held"
    assert proxy.connections >= 2, "the client did not send it again on a new connection"
    let_go.set()
    wait_until(lambda: proxy.delivered == 1, timeout=20)


# -- 5. acquire ------------------------------------------------------------------


def test_an_acquisition_arriving_after_its_lease_was_released_writes_nothing(
    proxy: FaultProxy, late: RedisBackend, direct: RedisBackend, key: str
) -> None:
    signals = SignalRecorder()
    lock_lost.connect(signals, weak=False)
    lock_released.connect(signals, weak=False)
    ran: list[bool] = []
    try:
        let_go = held_back(proxy, late, "acquire", key)
        result = TaskLockService(late).run_exclusive(key, lambda: ran.append(True), ttl=LONG)
    finally:
        lock_lost.disconnect(signals)
        lock_released.disconnect(signals)
    try:
        # The re-send was granted, the work ran and released: the run is over.
        assert (result.acquired, ran, result.lost) == (True, [True], False)
        assert [name for name, _ in signals.sent] == ["released"]
        assert direct.peek(key) is None
        arrives_late(proxy, let_go)
        held = direct.peek(key)
        assert held is None, f"the late acquisition wrote a lease nobody holds: {held}"
        assert direct.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE), "the key is not free"
    finally:
        forget(direct._conn(), key)


# -- 6. refresh ------------------------------------------------------------------


@pytest.mark.parametrize("script", ["refresh", "refresh_many"])
def test_a_refresh_arriving_after_a_min_hold_release_never_extends_the_lease(
    proxy: FaultProxy, late: RedisBackend, direct: RedisBackend, key: str, script: str
) -> None:
    token = new_token()
    try:
        assert direct.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        let_go = held_back(proxy, late, script, key)
        # The heartbeat's refresh, given up on and sent again: the re-send is answered.
        if script == "refresh":
            assert late.refresh(key, token, ttl=LONG, max_lifetime=LIFE)
        else:
            assert late.refresh_many([Refresh(key, token, LONG, LIFE)]) == [True]
        assert late.release(key, token, min_hold=MIN_HOLD)  # cut to acquisition + 20 s
        arrives_late(proxy, let_go)
        held = direct.peek(key)
        assert held is not None, "the cut lease ended before acquisition + min_hold"
        assert held.seconds_left <= MIN_HOLD.total_seconds(), (
            f"a late refresh extended a released lease: {held.seconds_left:.1f} s left"
        )
        assert not direct.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
    finally:
        forget(direct._conn(), key, token)


# -- 7. permits (limit=N): the same, per permit ------------------------------------


def test_a_permit_asked_for_arriving_after_its_release_writes_nothing(
    proxy: FaultProxy, late: RedisBackend, direct: RedisBackend, key: str
) -> None:
    token = new_token()
    terms: dict[str, Any] = {"limit": 2, "ttl": LONG, "max_lifetime": LIFE}
    try:
        let_go = held_back(proxy, late, "permit", key)
        name = late.acquire_permit(key, token, **terms)  # the re-send is answered
        assert name is not None
        assert late.release(name, token)
        arrives_late(proxy, let_go)
        held = [lock for lock in direct.list() if lock.key.startswith(key)]
        assert held == [], f"the late request wrote a permit nobody holds: {held}"
        others = [new_token(), new_token()]
        assert None not in [direct.acquire_permit(key, t, **terms) for t in others]
    finally:
        forget(direct._conn(), key, token)


@pytest.mark.parametrize("script", ["refresh", "refresh_permits"])
def test_a_permits_refresh_arriving_after_a_min_hold_release_never_extends_it(
    proxy: FaultProxy, late: RedisBackend, direct: RedisBackend, key: str, script: str
) -> None:
    token = new_token()
    try:
        name = direct.acquire_permit(key, token, limit=2, ttl=LONG, max_lifetime=LIFE)
        assert name is not None
        let_go = held_back(proxy, late, script, key)
        if script == "refresh":
            assert late.refresh(name, token, ttl=LONG, max_lifetime=LIFE)
        else:
            assert late.refresh_many([Refresh(name, token, LONG, LIFE)]) == [True]
        assert late.release(name, token, min_hold=MIN_HOLD)
        arrives_late(proxy, let_go)
        held = direct.peek(name)
        assert held is not None, "the cut permit ended before acquisition + min_hold"
        assert held.seconds_left <= MIN_HOLD.total_seconds(), (
            f"a late refresh extended a released permit: {held.seconds_left:.1f} s left"
        )
    finally:
        forget(direct._conn(), key, token)


# -- the same on Redis Cluster: the late copy sent again by hand ------------------


class Recorded:
    """The script calls a backend makes (name, keys, arguments), made as it makes them."""

    def __init__(self, backend: RedisBackend) -> None:
        self.scripts = backend._calls()
        self.calls: list[tuple[str, list[Any], list[Any]]] = []
        run = self.scripts.run

        def recording(name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
            self.calls.append((name, list(keys), list(args)))
            return run(name, keys, args)

        self.scripts.run = recording  # type: ignore[method-assign]
        run_batch = self.scripts.run_batch

        def recording_batch(batch: Any, failed: Any) -> Any:
            # The heartbeat's batches go out packed, not through run().
            self.calls.extend((name, list(keys), list(args)) for name, keys, args in batch.calls)
            return run_batch(batch, failed)

        self.scripts.run_batch = recording_batch  # type: ignore[method-assign]

    def last(self, name: str) -> tuple[str, list[Any], list[Any]]:
        """The last call of the script ``name``."""
        for call in self.calls[::-1]:
            if call[0] == name:
                return call
        raise AssertionError(f"no {name} was sent")

    def again(self, client: Any, call: tuple[str, list[Any], list[Any]]) -> Any:
        """``call`` sent once more, as its late copy arrives: the same ``EVALSHA``."""
        name, keys, args = call
        return client.evalsha(self.scripts.shas[name], len(keys), *keys, *args)


# -- 8. how long a tombstone lives ------------------------------------------------


@pytest.mark.parametrize(
    ("made", "at_least", "at_most"),
    [
        # redis-py 8's defaults: 5 s socket and connect timeouts, 10 retries, backoff
        # capped at 1 s: one release may go on being sent for 11 x 10 + 10 = 120 s.
        ("by hand", 119_000, 120_000),
        # From a URL: 10 s, no retries: the 60 s floor.
        ("from the url", 59_000, 60_000),
    ],
)
def test_a_release_tombstone_lives_as_long_as_the_client_may_send_the_release_again(
    direct: RedisBackend, key: str, made: str, at_least: int, at_most: int
) -> None:
    import redis

    assert settings.REDIS_URL is not None
    if made == "by hand":
        db = int(urlsplit(settings.REDIS_URL).path.strip("/") or "0")
        parts = urlsplit(settings.REDIS_URL)
        client = redis.Redis(host=parts.hostname or "127.0.0.1", port=parts.port or 6379, db=db)
        backend = RedisBackend(client=client)
    else:
        backend = RedisBackend(url=settings.REDIS_URL)
    token = new_token()
    try:
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.release_outcome(key, token) is Released.RELEASED
        left = direct._conn().pttl(tombstone_key(key, token))
        assert at_least <= left <= at_most, f"the tombstone lives {left} ms"
        # Within it, the release sent again is recognised: no loss.
        assert backend.release_outcome(key, token) is Released.GONE
    finally:
        forget(direct._conn(), key, token)
        backend._conn().close()


@pytest.fixture
def on_cluster(redis_cluster: PrivateCluster) -> Iterator[tuple[RedisBackend, Any]]:
    """The Redis backend on the private cluster, and a raw client of the cluster."""
    backend = RedisBackend(url=redis_cluster.url)
    raw = redis_cluster.client()
    yield backend, raw
    backend._conn().close()
    raw.close()


def test_on_a_cluster_a_late_acquisition_after_the_release_writes_nothing(
    on_cluster: tuple[RedisBackend, Any], key: str
) -> None:
    backend, raw = on_cluster
    recorded, token = Recorded(backend), new_token()
    try:
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        acquisition = recorded.last("acquire")
        assert backend.release_outcome(key, token) is Released.RELEASED
        recorded.again(raw, acquisition)
        held = backend.peek(key)
        assert held is None, f"the late acquisition wrote a lease nobody holds: {held}"
        assert backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
    finally:
        forget(raw, key, token)


@pytest.mark.parametrize("script", ["refresh", "refresh_many"])
def test_on_a_cluster_a_late_refresh_never_extends_a_min_hold_release(
    on_cluster: tuple[RedisBackend, Any], key: str, script: str
) -> None:
    backend, raw = on_cluster
    recorded, token = Recorded(backend), new_token()
    refresh: Callable[[], Any] = {
        "refresh": lambda: backend.refresh(key, token, ttl=LONG, max_lifetime=LIFE),
        "refresh_many": lambda: backend.refresh_many([Refresh(key, token, LONG, LIFE)]),
    }[script]
    try:
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert refresh()
        call = recorded.last(script)
        assert backend.release(key, token, min_hold=MIN_HOLD)
        recorded.again(raw, call)
        held = backend.peek(key)
        assert held is not None
        assert held.seconds_left <= MIN_HOLD.total_seconds(), (
            f"a late refresh extended a released lease: {held.seconds_left:.1f} s left"
        )
    finally:
        forget(raw, key, token)


def test_on_a_cluster_a_release_sent_again_after_a_successor_took_the_key_is_not_a_loss(
    on_cluster: tuple[RedisBackend, Any], key: str
) -> None:
    backend, raw = on_cluster
    token, successor = new_token(), new_token()
    try:
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.release_outcome(key, token) is Released.RELEASED  # its reply lost
        assert backend.acquire(key, successor, ttl=LONG, max_lifetime=LIFE)
        # Sent again: the tombstone says this release ended the lease.
        assert backend.release_outcome(key, token) is Released.GONE
        held = backend.peek(key)
        assert held is not None
        assert held.lease == lease_id(successor)
        assert backend.release(key, successor)
    finally:
        forget(raw, key, token, successor)
