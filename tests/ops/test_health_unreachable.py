"""A storage the heartbeat cannot reach is a finding (W014), not "healthy".

Every refresh of a stopped Redis fails at once, so no tick is slow (W012 never
fires) and, without ``TASKLOCK_HEALTH``, the check reads no storage: before
this finding, the health check said nothing while the lock was lost.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
from django.test import Client, override_settings

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.checks import check_lock_health
from django_tasklock.leases.lease import clock
from django_tasklock.ops import health
from django_tasklock.testing.support import wait_until
from tests.support.servers import PrivateRedis, private_redis

pytestmark = pytest.mark.usefixtures("no_ticks")

TTL = 3.0
INTERVAL = 0.5
W014 = "django_tasklock.W014"
HAS_V4 = importlib.util.find_spec("health_check.base") is not None


@pytest.fixture
def server() -> Iterator[PrivateRedis]:
    with private_redis() as running:
        yield running


def _unreachable() -> list[health.Finding]:
    return [f for f in health.heartbeat_findings() if f.kind == health.STORAGE_UNREACHABLE]


def test_a_stopped_redis_is_reported_until_it_answers_again(
    server: PrivateRedis, key: str
) -> None:
    service = TaskLockService(RedisBackend(url=f"{server.url}?socket_timeout=1"))
    with service.lock(key, ttl=TTL, refresh_interval=INTERVAL) as lock:
        lease = lock._lease
        assert lease is not None
        acquired = lease.answered_at
        wait_until(lambda: lease.answered_at > acquired, timeout=30)  # a refresh answered
        assert _unreachable() == []
        stopped_at = clock()
        server.stop()
        wait_until(lambda: _unreachable() != [], timeout=30)
        [finding] = _unreachable()
        assert finding.error == "ConnectionError"
        assert 0 <= finding.seconds <= clock() - stopped_at
        assert "cannot reach the lock storage" in finding.describe()
        assert W014 in {str(m.id) for m in check_lock_health()}
        # Lost at its deadline; still reported: the storage is still down.
        wait_until(lambda: lock.lost, timeout=30)
        assert _unreachable() != []
    server.start()
    # One refresh answered there again ends the finding.
    with service.lock(f"{key}-again", ttl=TTL, refresh_interval=INTERVAL):
        wait_until(lambda: _unreachable() == [], timeout=30)
    assert W014 not in {str(m.id) for m in check_lock_health()}


@pytest.mark.skipif(not HAS_V4, reason="django-health-check 4 needs Django 5.2+")
@override_settings(ROOT_URLCONF="tests.health_urls")
def test_the_health_check_view_is_unavailable(server: PrivateRedis, key: str) -> None:
    service = TaskLockService(RedisBackend(url=f"{server.url}?socket_timeout=1"))
    with service.lock(key, ttl=TTL, refresh_interval=INTERVAL):
        server.stop()
        wait_until(lambda: _unreachable() != [], timeout=30)
        response = Client().get("/ht/", {"format": "json"})
    assert response.status_code == 500
    [message] = response.json().values()
    assert message.startswith("Unavailable: This process's heartbeat cannot reach"), message
    assert "127.0.0.1" not in message  # never the error's text
