"""A storage clock that steps forward ends leases early: their holders learn at the next tick.

A step forward of the storage's clock (an NTP step, a virtual machine resumed)
ends every lease stored there that many seconds sooner by real time, and its
``max_lifetime`` cap too. The heartbeat reads the storage's clock at each tick
(``BaseBackend.storage_time()``) and brings the leases of the process there
forward (``leases/storage_clock.py``). The step is made by
``tests/support/clock_step.py`` (every stored time moved back, the clock read
ahead), and for real on a PostgreSQL run under libfaketime.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.base import BaseBackend
from django_tasklock.leases.lease import clock
from django_tasklock.reasons import EXPIRED, MAX_LIFETIME
from django_tasklock.testing import BackendRecipe, ContractBackend
from django_tasklock.testing.support import LIFE, wait_until
from tests.support import services
from tests.support.clock_step import SteppedClock
from tests.support.fault_workers import hold_two, migrate
from tests.support.servers import private_postgres

pytestmark = pytest.mark.slow


@pytest.fixture
def stepped(any_backend: ContractBackend, key: str) -> Iterator[SteppedClock]:
    if any_backend.name == "memory":
        pytest.skip("memory: its clock is this process's monotonic clock, which never steps")
    backend = SteppedClock(any_backend.backend, key)
    yield backend
    backend.close()


def test_the_storage_time_is_the_storages_clock(any_backend: ContractBackend) -> None:
    # Every storage the tests use runs on this host: its clock is this host's.
    reading = any_backend.backend.storage_time()
    if any_backend.name == "memory":
        assert reading is None
        return
    assert reading is not None
    assert abs(reading - time.time()) < 5


def _contend(backend: BaseBackend, key: str, token: str, seen: list[bool], lost: object) -> None:
    """Take ``key`` as soon as the storage frees it; note the holder's ``lost`` then."""
    end = clock() + 60
    try:
        while clock() < end:
            if backend.acquire(key, token, ttl=timedelta(seconds=30), max_lifetime=LIFE):
                seen.append(bool(lost.lost))  # type: ignore[attr-defined]
                return
            time.sleep(0.02)
    finally:
        backend.close()  # this thread's connection


def _refreshed_once(lock: object) -> bool:
    lease = lock._lease  # type: ignore[attr-defined]
    return lease is not None and lease.answered_at > lease.asked_at


def test_a_step_brings_the_max_lifetime_cap_forward(stepped: SteppedClock, key: str) -> None:
    """The storage caps the lease at acquisition + max_lifetime by its own clock: after a
    step it frees the key that much sooner, and the holder must know it by then."""
    contender = new_token()
    seen: list[bool] = []  # the holder's lost, read once the contender had the key
    with TaskLockService(stepped).lock(key, ttl=6, refresh_interval=0.5, max_lifetime=10) as lock:
        wait_until(lambda: _refreshed_once(lock), timeout=30)
        # Less than the ttl left (5.5 s at least): the lease itself outlives the step,
        # refreshed by the stepped clock from the next tick on; its cap comes 3 s sooner.
        stepped.step(3.0)
        thread = threading.Thread(
            target=_contend, args=(stepped.inner, key, contender, seen, lock)
        )
        thread.start()
        thread.join(90)
    assert seen == [True], "a contender had the key while its holder counted it live"
    assert lock._lease is not None
    assert lock._lease.reason == MAX_LIFETIME
    assert stepped.inner.release(key, contender)


def test_every_lease_there_learns_of_a_step_at_the_next_tick(
    stepped: SteppedClock, key: str
) -> None:
    """One tick's reading of the clock serves every lease of the process on that storage:
    a lease refreshed every 20 s learns of the step from one refreshed every 0.5 s."""
    service = TaskLockService(stepped)
    short = service.lock(f"{key}-short", ttl=2, refresh_interval=0.5)
    long = service.lock(f"{key}-long", ttl=60, refresh_interval=20)
    with short, long:
        wait_until(lambda: _refreshed_once(short), timeout=30)
        stepped.step(90.0)  # past both leases' ends: the storage has freed both keys
        stepped_at = clock()
        wait_until(lambda: long.lost, timeout=15)  # its own refresh is 20 s away
        noticed = clock() - stepped_at
    assert long._lease is not None
    assert long._lease.reason == EXPIRED
    assert noticed < 15


def test_a_step_back_keeps_every_lease(stepped: SteppedClock, key: str) -> None:
    """A storage clock set back keeps its leases longer: nothing is lost."""
    with TaskLockService(stepped).lock(key, ttl=2, refresh_interval=0.3) as lock:
        wait_until(lambda: _refreshed_once(lock), timeout=30)
        stepped.step(-30.0)
        time.sleep(0)  # nothing to wait for: the next ticks must find nothing wrong
        ticks_after = clock() + 1.5
        wait_until(lambda: clock() > ticks_after, timeout=30)
        assert not lock.lost


def test_a_real_postgresql_clock_step_is_noticed_at_the_next_tick(key: str) -> None:
    """The same on a PostgreSQL whose clock really steps (libfaketime), held by another process."""
    ctx = multiprocessing.get_context("spawn")
    with private_postgres(clock_offset=0.0) as server:
        recipe = BackendRecipe(
            backend="django_tasklock.backends.database.DatabaseBackend",
            settings={
                "DATABASES": {"default": services.postgres_settings(server.url)},
                "INSTALLED_APPS": ["django_tasklock"],
            },
        )
        migrating = ctx.Process(target=migrate, args=(recipe,))
        migrating.start()
        migrating.join(120)
        assert migrating.exitcode == 0
        ours, theirs = ctx.Pipe()
        holder = ctx.Process(target=hold_two, args=(recipe, key, theirs))
        holder.start()
        try:
            assert ours.poll(60)
            assert ours.recv() == "holding"
            server.step_clock(90.0)  # past both leases' ends
            stepped_at = clock()
            assert ours.poll(30), "the long lease was never declared lost"
            found = ours.recv()
            ours.send("done")
        finally:
            holder.join(30)
            if holder.is_alive():
                holder.kill()
    assert found["reason"] == EXPIRED
    assert found["lost_at"] - stepped_at < 15  # its own refresh was 20 s away
