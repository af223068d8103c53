"""Locks taken inside the caller's transaction: held until it ends, no connection left behind."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import close_old_connections, connections, transaction
from django.db.models.functions import Now

from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.base import BaseBackend
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.backends.database.connections import add_thread_connection
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.models import CacheEntry
from tests.conftest import require_service

pytestmark = pytest.mark.databases

LONG, LIFE = timedelta(seconds=30), timedelta(hours=1)


@pytest.fixture
def pg() -> str:
    require_service("postgres")
    return "postgres"


def _in_thread(target: Callable[[], Any]) -> threading.Thread:
    def run() -> None:
        try:
            target()
        finally:
            connections.close_all()  # the test database is dropped at the end

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _free_within(backend: BaseBackend, key: str, seconds: float) -> bool:
    """Whether ``key`` is free at some moment in the next ``seconds`` (polled)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if backend.peek(key) is None:
            return True
        time.sleep(0.05)
    return False


def _backends_of_test_database(alias: str, application_name: str | None = None) -> int:
    """Server connections to the test database, seen from ``alias``'s own connection."""
    sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND backend_type = 'client backend'"
    )
    params: list[str] = []
    if application_name is not None:
        sql += " AND application_name = %s"
        params.append(application_name)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        (count,) = cursor.fetchone()
    return int(count)


def _backends_drop_to(alias: str, count: int, application_name: str | None = None) -> bool:
    """Whether the server's count of connections falls to ``count`` within a few seconds.

    A backend leaves ``pg_stat_activity`` a moment after its client closed it.
    """
    deadline = time.monotonic() + 5
    while _backends_of_test_database(alias, application_name) > count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- held until the caller's transaction ends -------------------------------


def test_next_holder_waits_for_the_commit_and_sees_the_work(pg: str, key: str) -> None:
    service = TaskLockService(DatabaseBackend(using=pg))
    effect = f"effect:{key}"
    ran, committed = threading.Event(), threading.Event()
    may_commit = threading.Event()
    seen: dict[str, Any] = {}

    def first() -> None:
        with transaction.atomic(using=pg):
            seen["first"] = service.run_exclusive(
                key,
                lambda: CacheEntry.objects.using(pg).create(
                    key=effect, value="done", expires_at=Now(), created_at=Now()
                ),
            ).acquired
            ran.set()
            may_commit.wait(10)
        committed.set()

    def second() -> None:
        ran.wait(10)
        seen["before_commit"] = service.run_exclusive(key, lambda: None).acquired
        may_commit.set()
        committed.wait(10)
        seen["after_commit"] = service.run_exclusive(
            key, lambda: CacheEntry.objects.using(pg).filter(key=effect).exists()
        )

    threads = [_in_thread(first), _in_thread(second)]
    for thread in threads:
        thread.join(20)
    assert seen["first"] is True
    assert seen["before_commit"] is False  # the work is not committed yet
    after = seen["after_commit"]
    assert (after.acquired, after.result) == (True, True)  # released at commit, work seen


def test_work_rolled_back_is_released_by_the_heartbeat_before_the_ttl(pg: str, key: str) -> None:
    backend = DatabaseBackend(using=pg)
    service = TaskLockService(backend)
    with transaction.atomic(using=pg):
        result = service.run_exclusive(key, lambda: None, ttl=LONG, refresh_interval=10)
        assert backend.peek(key) is not None  # held while the transaction is open
        transaction.set_rollback(True, using=pg)
    assert result.acquired
    assert not result.lost
    # Long before the ttl (30 s) and the first refresh (10 s): noticed by the heartbeat.
    assert _free_within(backend, key, 8)


def test_lease_waits_for_the_callers_commit_whatever_the_backend(key: str) -> None:
    # Effects may go to any database: a lease in memory waits for SQLite's commit too.
    service = TaskLockService(MemoryBackend())
    released: list[str] = []

    def on_released(**kwargs: Any) -> None:
        released.append(kwargs["key"])

    from django_tasklock import lock_released

    lock_released.connect(on_released)
    try:
        with transaction.atomic():
            assert service.run_exclusive(key, lambda: None).acquired
            assert not service.run_exclusive(key, lambda: None).acquired
            assert released == []
        assert released == [key]  # at once after the commit, in this thread
    finally:
        lock_released.disconnect(on_released)
    assert service.peek(key) is None


def test_savepoint_rolled_back_releases_while_the_outer_transaction_goes_on(key: str) -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)

    def work_rolled_back() -> None:
        with transaction.atomic():
            assert service.run_exclusive(key, lambda: None, ttl=LONG).acquired
            assert backend.peek(key) is not None
            raise RuntimeError("roll the savepoint back")

    with transaction.atomic():
        with pytest.raises(RuntimeError):
            work_rolled_back()
        assert _free_within(backend, key, 8)


def test_manual_transaction_management_leaves_the_lease_to_expire(
    key: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)

    def work() -> None:  # a write: the caller's transaction is open when the work ends
        CacheEntry.objects.create(key=f"work-{key}", value="x", expires_at=Now(), created_at=Now())

    transaction.set_autocommit(False)
    try:
        with caplog.at_level(logging.INFO, logger="django_tasklock"):
            result = service.run_exclusive(key, work, ttl=0.5, refresh_interval=0.1)
        held = backend.peek(key)
        assert held is not None  # the commit cannot be waited for: kept until the ttl
        time.sleep(0.3)
        later = backend.peek(key) or held
        assert abs((later.expires_at - held.expires_at).total_seconds()) < 0.1  # not refreshed
        transaction.rollback()
    finally:
        transaction.set_autocommit(True)
    assert result.acquired
    assert not result.lost
    assert _free_within(backend, key, 5)
    assert "autocommit" in caplog.text


def test_lease_lost_before_the_commit_is_reported_once_at_the_commit(
    key: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)
    with transaction.atomic():
        result = service.run_exclusive(key, lambda: None)
        assert backend.force_release(key)  # an operator, while the caller's work is open
        assert "was lost" not in caplog.text
    assert result.acquired
    assert caplog.text.count("was lost") == 1
    assert backend.peek(key) is None


# -- connections the lock opens -------------------------------------------


def test_no_connection_outlives_close_old_connections_in_idle_threads(pg: str) -> None:
    backend = DatabaseBackend(using=pg)
    threads = 6
    idle = threading.Barrier(threads + 1)
    done = threading.Barrier(threads + 1)
    before = _backends_of_test_database(pg)

    def worker(n: int) -> None:
        token = new_token()
        with transaction.atomic(using=pg):
            assert backend.acquire(f"idle-{n}", token, ttl=LONG, max_lifetime=LIFE)
        assert backend.release(f"idle-{n}", token)
        close_old_connections()  # what a task worker does between tasks
        idle.wait(10)
        done.wait(10)

    workers = [_in_thread(functools.partial(worker, n)) for n in range(threads)]
    idle.wait(10)
    try:
        assert _backends_drop_to(pg, before)
    finally:
        done.wait(10)
        for thread in workers:
            thread.join(10)


def _pools() -> dict[str, Any]:
    """Django's PostgreSQL connection pools, by alias."""
    from django.db.backends.postgresql.base import DatabaseWrapper

    pools: dict[str, Any] = DatabaseWrapper._connection_pools  # type: ignore[attr-defined]
    return pools


@pytest.fixture
def pooled(pg: str) -> Iterator[str]:
    """A thread-only alias of the test database with Django's connection pool (psycopg_pool)."""
    import django

    if django.VERSION < (5, 1):
        pytest.skip("Django's connection pool is new in Django 5.1")
    settings_dict = dict(connections[pg].settings_dict)
    settings_dict["OPTIONS"] = {
        **settings_dict["OPTIONS"],
        "pool": {"min_size": 2, "max_size": 2, "timeout": 10},
        "application_name": "tasklock-pool-test",
    }
    settings_dict["CONN_MAX_AGE"] = 0
    add_thread_connection("pooled", settings_dict)
    try:
        yield "pooled"
    finally:
        connections["pooled"].close()
        for name in [name for name in _pools() if "pooled" in name]:
            _pools().pop(name).close()
        del connections["pooled"]


def test_a_pooled_database_gets_no_second_pool(pooled: str, pg: str) -> None:
    backend = DatabaseBackend(using=pooled)
    token = new_token()
    with transaction.atomic(using=pooled):
        assert backend.acquire("pooled", token, ttl=LONG, max_lifetime=LIFE)
        assert backend.peek("pooled") is not None
    assert backend.release("pooled", token)
    connections[pooled].close()  # back to the pool, as at the end of a request
    pools = {name: pool for name, pool in _pools().items()}
    assert [name for name in pools if "pooled" in name] == ["pooled"]
    for name, pool in pools.items():
        if "pooled" in name:
            pool.wait(10)  # filled to min_size: what the pools keep open
    assert _backends_drop_to(pg, 2, "tasklock-pool-test")
