"""A refresh the database makes wait (a row lock, a busy SQLite file) past the ttl.

While the heartbeat's refresh waits, the holder knows its lease only until
the last confirmed refresh plus ``ttl``; by then it must say the lock is lost,
without waiting for the statement to answer or time out (the Redis twin,
``CLIENT PAUSE``, is in ``test_redis_pause.py``).
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections, transaction
from django.db.models import F

from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.lease import clock
from django_tasklock.models import CacheEntry
from django_tasklock.service import TaskLockService
from django_tasklock.signals import lock_lost
from tests.conftest import DATABASE_ALIASES, require_service

pytestmark = pytest.mark.databases

TTL = 1.0
BLOCKED = 2.5  # longer than the ttl, shorter than the refresh's 5 s statement timeout
SLACK = 0.3


@pytest.fixture(params=["default", "postgres", "mariadb"], ids=["sqlite", "postgres", "mariadb"])
def alias(request: pytest.FixtureRequest) -> str:
    if request.param not in DATABASE_ALIASES:
        require_service(request.param)
    return str(request.param)


def _block_row(alias: str, stored: str, seconds: float, started: threading.Event) -> None:
    """Hold a write lock on the row (and, on SQLite, the whole file) for ``seconds``."""
    try:
        with transaction.atomic(using=alias):
            CacheEntry.objects.using(alias).filter(key=stored).update(value=F("value"))
            started.set()
            time.sleep(seconds)
    finally:
        connections[alias].close()


def test_a_refresh_kept_waiting_past_the_ttl_is_a_loss_declared_on_time(
    alias: str, key: str
) -> None:
    lost_at: list[float] = []

    def on_lost(sender: object, key: str, **kwargs: object) -> None:
        lost_at.append(clock())

    service = TaskLockService(DatabaseBackend(using=alias))
    lock_lost.connect(on_lost, weak=False)
    try:
        with service.lock(key, ttl=TTL, refresh_interval=0.25) as lock:
            time.sleep(0.4)  # a refresh or two confirmed
            started = threading.Event()
            blocked_at = clock()
            blocker = threading.Thread(
                target=_block_row, args=(alias, f"task-lock:{key}", BLOCKED, started)
            )
            blocker.start()
            assert started.wait(5)
            # Known live until at most the block + ttl: lost by then, while the
            # refresh still waits for the row.
            while not lock.lost and clock() < blocked_at + BLOCKED:
                time.sleep(0.01)
            assert lost_at, "the loss was not declared while the refresh waited"
            assert lost_at[0] - blocked_at <= TTL + SLACK
            blocker.join()
    finally:
        lock_lost.disconnect(on_lost)
    assert lock.lost
    assert len(lost_at) == 1  # the refresh's late answer is not a second report
