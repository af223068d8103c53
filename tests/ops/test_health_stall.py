"""A real stalled heartbeat, as the health check sees it.

The holder's refresh is kept waiting (a row lock held by another transaction
on the database; ``CLIENT PAUSE`` on a private Redis) for less than the ttl:
the lock is not lost, but its heartbeat falls behind. This process sees its
own tick running past the refresh interval (W012); the storage, where it can
still be read, shows the lease not refreshed for more than two intervals
(W011). Both clear once the storage answers again. A holder in another
process, paused (SIGSTOP), is seen through the storage only.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.checks import check_lock_health
from django_tasklock.leases import heartbeat
from django_tasklock.leases.lease import clock
from django_tasklock.ops import health
from django_tasklock.testing import BackendRecipe
from tests.conftest import DATABASE_ALIASES, require_service
from tests.leases.test_stalled_refresh import _block_row
from tests.support.fault_workers import hold_through
from tests.support.servers import PrivateRedis, private_redis

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_ticks")]

TTL = 8.0
INTERVAL = 1.0
STALL = 4.5  # longer than two intervals, shorter than the ttl: behind, not lost
#: The paused Redis's: the refresh sent just before it answered by ttl - interval.
PAUSE = 6.0
W011, W012, W013 = (f"django_tasklock.W01{n}" for n in (1, 2, 3))


def _ids() -> set[str]:
    return {str(message.id) for message in check_lock_health()}


def _storage_ids() -> set[str]:
    """What the check reads from the storage, without W012: that one is about this
    process's own heartbeat, not the other process's lease."""
    return _ids() - {W012}


def _until(wanted: set[str], *, within: float) -> set[str]:
    """Run the check until it reports ``wanted`` (or exactly nothing, for an empty set)."""
    deadline = clock() + within
    while True:
        found = _ids()
        if (wanted <= found if wanted else not found) or clock() > deadline:
            return found
        time.sleep(0.1)


@pytest.fixture(params=["default", "postgres", "mariadb"], ids=["sqlite", "postgres", "mariadb"])
def alias(request: pytest.FixtureRequest) -> str:
    if request.param not in DATABASE_ALIASES:
        require_service(request.param)
    return str(request.param)


@pytest.mark.databases
def test_a_refresh_kept_waiting_by_a_row_lock(alias: str, key: str) -> None:
    health = {key: {"ttl": TTL, "refresh_interval": INTERVAL}}
    service = TaskLockService(DatabaseBackend(using=alias))
    with (
        override_settings(
            TASKLOCK_BACKEND="database", TASKLOCK_DATABASE=alias, TASKLOCK_HEALTH=health
        ),
        service.lock(key, ttl=TTL, refresh_interval=INTERVAL) as lock,
    ):
        time.sleep(1.5 * INTERVAL)  # a refresh confirmed
        assert _ids() == set()
        started = threading.Event()
        blocker = threading.Thread(
            target=_block_row, args=(alias, f"task-lock:{key}", STALL, started)
        )
        blocker.start()
        try:
            assert started.wait(5)
            blocked_at = clock()
            # Reads are not blocked: the storage shows the lease falling behind too.
            found = _until({W011, W012}, within=STALL - 0.5)
            assert clock() < blocked_at + STALL, "the stall ended before it was seen: lengthen it"
        finally:
            blocker.join()
        assert found == {W011, W012}
        assert _until(set(), within=3 * INTERVAL) == set()  # refreshed again
        assert not lock.lost


@pytest.fixture
def server() -> Iterator[PrivateRedis]:
    with private_redis() as running:
        yield running


def test_a_refresh_kept_waiting_by_a_paused_redis(server: PrivateRedis, key: str) -> None:
    # The holder waits longer than the pause; the check gives up after 1 s.
    holder = RedisBackend(url=f"{server.url}?socket_timeout={TTL}")
    limits = {key: {"ttl": TTL, "refresh_interval": INTERVAL}}
    admin = redis.Redis.from_url(server.url)
    with (
        override_settings(
            TASKLOCK_BACKEND="redis",
            TASKLOCK_REDIS_URL=f"{server.url}?socket_timeout=1",
            TASKLOCK_HEALTH=limits,
        ),
        TaskLockService(holder).lock(key, ttl=TTL, refresh_interval=INTERVAL) as lock,
    ):
        time.sleep(1.5 * INTERVAL)
        assert _ids() == set()
        paused_at = clock()
        admin.client_pause(int(PAUSE * 1000), all=True)
        try:
            # The heartbeat is watched here (cheaply), then the check is run once (it waits
            # a second for the paused storage); the heartbeat stays behind until the pause ends.
            assert _wait(lambda: bool(health.heartbeat_findings()), within=PAUSE - 2.5)
            # A paused Redis cannot be read either: only this process's heartbeat tells.
            found = _ids()
            assert clock() < paused_at + PAUSE, "the pause ended before it was seen: lengthen it"
        finally:
            admin.client_unpause()
        assert found == {W012, W013}
        assert _until(set(), within=3 * INTERVAL) == set()
        assert not lock.lost


def test_a_reap_kept_waiting_by_a_paused_redis_shows_the_heartbeat_behind(
    server: PrivateRedis, key: str
) -> None:
    """The heartbeat's look for dead holders (every 5 s, on its thread) waits for the paused
    storage too, and every lease's refresh waits behind it: that is the heartbeat behind,
    reported as W012 (before, only refreshes counted, and a pause that met a reap went
    unseen)."""
    holder = RedisBackend(url=f"{server.url}?socket_timeout={TTL}")
    with TaskLockService(holder).lock(key, ttl=TTL, refresh_interval=INTERVAL) as lock:
        time.sleep(1.5 * INTERVAL)
        assert not health.heartbeat_findings()
        beat = heartbeat._heartbeat
        redis.Redis.from_url(server.url).client_pause(int(PAUSE * 1000), all=True)
        with beat._cond:  # the reap is due now, during the pause
            beat._reaper.due_at = clock()
            beat._cond.notify_all()
        try:
            seen = _wait(lambda: bool(health.heartbeat_findings()), within=PAUSE - 2.5)
        finally:
            redis.Redis.from_url(server.url, socket_timeout=PAUSE + 5).client_unpause()
        assert seen
        assert not lock.lost


def test_a_slow_tick_is_not_hidden_by_the_quick_ticks_after_it(
    server: PrivateRedis, key: str
) -> None:
    """Leases on two backends, ticks in a row on the one heartbeat thread. The paused
    Redis's tick took longer than its interval; the ticks right after it are quick.
    The heartbeat is still behind, for two of the slow tick's intervals after it
    ended."""
    paused = TaskLockService(RedisBackend(url=f"{server.url}?socket_timeout={TTL}"))
    quick = TaskLockService(MemoryBackend())
    admin = redis.Redis.from_url(server.url)
    with (
        paused.lock(key, ttl=TTL, refresh_interval=INTERVAL) as slow,
        quick.lock(key, ttl=TTL, refresh_interval=0.1) as fast,
    ):
        assert slow._lease is not None
        assert fast._lease is not None
        slow_lease, fast_lease = slow._lease, fast._lease
        acquired = slow_lease.answered_at
        assert _wait(lambda: slow_lease.answered_at > acquired, within=5 * INTERVAL)
        admin.client_pause(int(STALL * 1000), all=True)  # just after a refresh: the next waits
        paused_at = clock()
        try:
            assert _wait(lambda: slow_lease.answered_at > paused_at, within=STALL + 5)
        finally:
            admin.client_unpause()
        # Quick ticks after it: the memory backend's (waited for), and often first the
        # paused lease's own next one (overdue by then).
        answered = slow_lease.answered_at
        assert _wait(lambda: fast_lease.answered_at > answered, within=2 * INTERVAL)
        found = health.heartbeat_findings()
        # The slow tick ended once the pause was over, about paused_at + STALL.
        in_time = clock() < paused_at + STALL + 2 * INTERVAL - 0.1
        assert in_time, "judged too late: the slow tick no longer counts (a loaded machine?)"
        assert _ids() == {W012}
    [finding] = found
    assert finding.seconds > INTERVAL
    assert not finding.under_way


def _wait(condition: Callable[[], bool], *, within: float) -> bool:
    deadline = clock() + within
    while not condition():
        if clock() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_holder_paused_in_another_process_is_seen_through_the_storage(key: str) -> None:
    require_service("redis")
    recipe = BackendRecipe(
        backend="django_tasklock.backends.redis.RedisBackend",
        kwargs={"url": settings.REDIS_URL},
        settings={"INSTALLED_APPS": ["django_tasklock"]},
    )
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    holder = ctx.Process(target=hold_through, args=(recipe, key, TTL, INTERVAL, theirs))
    holder.start()
    health = {key: {"ttl": TTL, "refresh_interval": INTERVAL}}
    try:
        assert ours.poll(60), "the holder never reported"
        assert ours.recv() == "holding"
        assert holder.pid is not None
        with override_settings(
            TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_URL=settings.REDIS_URL, TASKLOCK_HEALTH=health
        ):
            time.sleep(1.5 * INTERVAL)
            assert _storage_ids() == set()
            os.kill(holder.pid, signal.SIGSTOP)
            stopped_at = clock()
            try:
                found = _until({W011}, within=STALL)
                assert clock() < stopped_at + TTL, "the lease ran out before it was seen"
            finally:
                os.kill(holder.pid, signal.SIGCONT)
            # The holder is not this process: only the storage tells.
            assert found - {W012} == {W011}
            deadline = clock() + 3 * INTERVAL
            while _storage_ids() and clock() < deadline:
                time.sleep(0.1)
            assert _storage_ids() == set()
        ours.send("done")
        assert ours.poll(30), "the holder never finished"
        outcome = ours.recv()
        assert (outcome["acquired"], outcome["lost"]) == (True, False), outcome["log"]
    finally:
        holder.join(10)
        if holder.is_alive():  # pragma: no cover - only when an assertion above failed
            holder.kill()
