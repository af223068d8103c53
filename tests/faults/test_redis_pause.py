"""A Redis that stops answering for longer than the ttl (``CLIENT PAUSE``).

The holder must declare the loss by its own local deadline (the last
confirmed refresh plus ``ttl``), even while its refresh is still waiting for
an answer, and no call may hang past the connection's socket timeout. The
pause happens on a private Redis (``tests/support/servers.py``): pausing the shared
one would stall every other test.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.leases.lease import clock
from django_tasklock.signals import lock_lost
from tests.support.servers import PrivateRedis, private_redis

pytestmark = pytest.mark.slow

TTL = 1.0
CALLER_TIMEOUT = 1.0
# How late a loaded machine may wake a thread. The bounds below allow this much (a
# caller's call, 0.7 s of it), and each still tells what it checks from the failure
# it is there for: a loss declared on the refresh's failure comes HOLDER_TIMEOUT -
# 0.25 s after the pause began at the earliest; a call sent again after its socket
# timeout takes two of them.
LATE = 1.0
# Longer than the bounds allow the loss and the four calls below (2 + 4 x 1.7 s), so
# that every call times out inside it.
PAUSE = 10.0
# The holder's socket timeout: longer than its ttl, and than the wait of its release
# (sent some 5 s into the pause) for the pause to end.
HOLDER_TIMEOUT = 6.0


@pytest.fixture
def server() -> Iterator[PrivateRedis]:
    with private_redis() as running:
        yield running


@contextlib.contextmanager
def _from_url(server: PrivateRedis) -> Iterator[tuple[RedisBackend, RedisBackend]]:
    yield tuple(  # type: ignore[misc]
        RedisBackend(url=f"{server.url}?socket_timeout={timeout}")
        for timeout in (HOLDER_TIMEOUT, CALLER_TIMEOUT)
    )


@contextlib.contextmanager
def _from_cache(server: PrivateRedis) -> Iterator[tuple[RedisBackend, RedisBackend]]:
    caches = {
        f"paused-{timeout}": {
            "BACKEND": "django_redis.cache.RedisCache",
            # django-redis shares one pool per LOCATION: two, for two timeouts.
            "LOCATION": f"{server.url}?client_name=timeout-{timeout}",
            "OPTIONS": {"SOCKET_TIMEOUT": timeout, "SOCKET_CONNECT_TIMEOUT": timeout},
        }
        for timeout in (HOLDER_TIMEOUT, CALLER_TIMEOUT)
    }
    with override_settings(CACHES={**settings.CACHES, **caches}):
        yield tuple(RedisBackend(cache_alias=alias) for alias in caches)  # type: ignore[misc]


Source = Callable[
    [PrivateRedis], contextlib.AbstractContextManager[tuple[RedisBackend, RedisBackend]]
]


@pytest.mark.parametrize("source", [_from_url, _from_cache], ids=["url", "cache"])
def test_a_pause_longer_than_the_ttl_is_a_loss_declared_by_the_local_deadline(
    server: PrivateRedis, key: str, source: Source
) -> None:
    with source(server) as (holder_backend, caller):
        _pause_while_held(server, key, holder_backend, caller)


def _pause_while_held(
    server: PrivateRedis, key: str, holder_backend: RedisBackend, caller: RedisBackend
) -> None:
    admin = redis.Redis.from_url(server.url)
    lost_at: list[float] = []
    took: dict[str, float] = {}

    def on_lost(sender: object, key: str, **kwargs: object) -> None:
        if key == held_key:
            lost_at.append(clock())

    held_key = key

    def timed(name: str, call: Callable[[], Any]) -> None:
        start = clock()
        try:
            call()
        except redis.RedisError:
            took[name] = clock() - start
        else:
            since = start - paused_at
            raise AssertionError(f"{name}, sent {since:.2f} s into the pause, returned", took)

    life, ttl = timedelta(hours=1), timedelta(seconds=TTL)
    service = TaskLockService(holder_backend)
    lock_lost.connect(on_lost, weak=False)
    try:
        with service.lock(key, ttl=TTL, refresh_interval=0.25) as lock:
            time.sleep(0.6)  # a few refreshes confirmed
            assert not lock.lost
            paused_at = clock()
            admin.client_pause(int(PAUSE * 1000), all=True)
            # The lease is known live until at most the pause + ttl: lost by then.
            while not (lock.lost and lost_at) and clock() < paused_at + PAUSE:
                time.sleep(0.01)  # lock_lost comes from the notifier thread
            assert lost_at, "the holder never declared the loss during the pause"
            # By the local deadline (at most a ttl after the pause began), not by the
            # refresh under way failing: that needs the holder's socket timeout.
            assert lost_at[0] - paused_at <= TTL + LATE, (
                "declared after",
                lost_at[0] - paused_at,
            )
            # Every call another worker makes meanwhile fails within its socket timeout.
            timed("acquire", lambda: caller.acquire(key, new_token(), ttl=ttl, max_lifetime=life))
            timed("refresh", lambda: caller.refresh(key, new_token(), ttl=ttl, max_lifetime=life))
            timed("release", lambda: caller.release(key, new_token()))
            timed("peek", lambda: caller.peek(key))
            assert clock() < paused_at + PAUSE, ("the calls outlasted the pause", took)
            left_at = clock()
        # The holder's own release, sent inside the pause, returns (once the
        # pause ends) or fails within its socket timeout.
        assert clock() - left_at <= HOLDER_TIMEOUT + LATE, ("release", clock() - left_at)
        assert lock.lost
        assert len(lost_at) == 1, lost_at
        for name, seconds in took.items():
            # One socket timeout each (a call sent again would take two), woken late.
            assert seconds <= 1.7 * CALLER_TIMEOUT, (name, seconds)
        # Once Redis answers again the key is free (the holder's queued refresh
        # found it expired and did not revive it) and is acquired normally.
        time.sleep(max(0.0, paused_at + PAUSE + 0.2 - clock()))
        again = TaskLockService(caller).run_exclusive(key, lambda: "after", ttl=TTL)
        assert (again.acquired, again.result, again.lost) == (True, "after", False), (
            again,
            caller.peek(key),
        )
    finally:
        lock_lost.disconnect(on_lost)
        admin.client_unpause()
