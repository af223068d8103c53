"""What only the memory backend does, judged by an injected clock: exact boundaries."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.test import override_settings

import django_tasklock
from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends import get_backend
from django_tasklock.backends.base import STALE_AFTER, Capabilities
from django_tasklock.backends.memory import MemoryBackend

LIFE = timedelta(hours=1)
EPSILON = 1e-6


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def assert_lease_ends_at(backend: MemoryBackend, clock: FakeClock, when: float) -> None:
    """Key "k" is held until just before ``when`` and free from ``when`` on (moves the clock)."""
    clock.now = when - EPSILON
    assert backend.peek("k") is not None
    clock.now = when
    assert backend.peek("k") is None


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend(clock: FakeClock) -> MemoryBackend:
    return MemoryBackend(clock=clock)


def test_lease_ends_exactly_at_its_ttl(backend: MemoryBackend, clock: FakeClock) -> None:
    start, token = clock.now, new_token()
    assert backend.acquire("k", token, ttl=timedelta(seconds=10), max_lifetime=LIFE)

    clock.now = start + 10 - EPSILON
    held = backend.peek("k")
    assert held is not None
    assert held.seconds_left == pytest.approx(EPSILON)
    assert not backend.acquire("k", new_token(), ttl=timedelta(seconds=10), max_lifetime=LIFE)

    clock.now = start + 10
    assert backend.peek("k") is None
    assert backend.list() == []
    assert not backend.refresh("k", token, ttl=timedelta(seconds=10), max_lifetime=LIFE)
    assert not backend.release("k", token)
    assert backend.acquire("k", new_token(), ttl=timedelta(seconds=10), max_lifetime=LIFE)


def test_refresh_extends_from_now(backend: MemoryBackend, clock: FakeClock) -> None:
    start, token, ttl = clock.now, new_token(), timedelta(seconds=10)
    assert backend.acquire("k", token, ttl=ttl, max_lifetime=LIFE)
    clock.now = start + 6
    assert backend.refresh("k", token, ttl=ttl, max_lifetime=LIFE)
    assert_lease_ends_at(backend, clock, start + 16)


def test_refresh_is_capped_at_acquisition_plus_max_lifetime(
    backend: MemoryBackend, clock: FakeClock
) -> None:
    start, token = clock.now, new_token()
    ttl, life = timedelta(seconds=10), timedelta(seconds=25)
    assert backend.acquire("k", token, ttl=ttl, max_lifetime=life)
    clock.now = start + 8
    assert backend.refresh("k", token, ttl=ttl, max_lifetime=life)  # to start + 18
    clock.now = start + 17
    assert backend.refresh("k", token, ttl=ttl, max_lifetime=life)  # capped: start + 25
    held = backend.peek("k")
    assert held is not None
    assert held.seconds_left == pytest.approx(8)
    clock.now = start + 24
    assert backend.refresh("k", token, ttl=ttl, max_lifetime=life)  # still True, not extended
    assert_lease_ends_at(backend, clock, start + 25)
    assert not backend.refresh("k", token, ttl=ttl, max_lifetime=life)
    assert backend.acquire("k", new_token(), ttl=ttl, max_lifetime=life)


def test_first_lease_is_capped_at_max_lifetime(backend: MemoryBackend, clock: FakeClock) -> None:
    start = clock.now
    ttl, life = timedelta(seconds=30), timedelta(seconds=4)
    assert backend.acquire("k", new_token(), ttl=ttl, max_lifetime=life)
    assert_lease_ends_at(backend, clock, start + 4)


def test_lease_older_than_24_hours_is_taken_over_whatever_its_expiry(
    backend: MemoryBackend, clock: FakeClock
) -> None:
    # Only a backend driven past the service's validation can write such a lease.
    start, day = clock.now, STALE_AFTER.total_seconds()
    long = timedelta(hours=30)
    assert backend.acquire("k", new_token(), ttl=long, max_lifetime=long)
    clock.now = start + day
    assert backend.peek("k") is not None  # 24 h exactly is not "more than 24 h"
    assert backend.clear_stale(dry_run=True) == 0
    clock.now = start + day + EPSILON
    assert backend.peek("k") is None
    assert backend.list() == []
    assert backend.clear_stale(dry_run=True) == 1
    assert backend.acquire("k", new_token(), ttl=timedelta(seconds=10), max_lifetime=LIFE)
    assert backend.clear_stale(dry_run=True) == 0


def test_clear_stale_counts_expired_and_abandoned_leases(
    backend: MemoryBackend, clock: FakeClock
) -> None:
    start, ttl = clock.now, timedelta(seconds=10)
    long = timedelta(hours=30)
    assert backend.acquire("abandoned", new_token(), ttl=long, max_lifetime=long)
    clock.now = start + STALE_AFTER.total_seconds() - 5
    live, released = new_token(), new_token()
    assert backend.acquire("live", live, ttl=timedelta(minutes=5), max_lifetime=LIFE)
    assert backend.acquire("expired-1", new_token(), ttl=ttl, max_lifetime=LIFE)
    assert backend.acquire("expired-2", new_token(), ttl=ttl, max_lifetime=LIFE)
    assert backend.acquire("released", released, ttl=ttl, max_lifetime=LIFE)
    assert backend.release("released", released)
    assert backend.clear_stale(dry_run=True) == 0

    clock.now += 10  # "abandoned" is now 24 h + 5 s old; the two expired at their ttl
    assert backend.clear_stale(dry_run=True) == 3
    assert backend.clear_stale(dry_run=True) == 3  # a dry run deletes nothing
    assert backend.clear_stale() == 3
    assert backend.clear_stale() == 0
    assert [held.key for held in backend.list()] == ["live"]
    assert backend.release("live", live)


def test_expired_lease_released_by_its_holder_is_gone_not_counted(
    backend: MemoryBackend, clock: FakeClock
) -> None:
    token = new_token()
    assert backend.acquire("k", token, ttl=timedelta(seconds=1), max_lifetime=LIFE)
    clock.now += 1
    assert not backend.release("k", token)
    assert backend.clear_stale(dry_run=True) == 0
    assert not backend.force_release("k")


def test_reported_times_follow_the_injected_clock(
    backend: MemoryBackend, clock: FakeClock
) -> None:
    assert backend.acquire("k", new_token(), ttl=timedelta(seconds=60), max_lifetime=LIFE)
    clock.now += 20
    before = datetime.now(timezone.utc)
    held = backend.peek("k")
    after = datetime.now(timezone.utc)
    assert held is not None
    assert held.seconds_left == pytest.approx(40)
    assert held.acquired_at.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=20) <= held.acquired_at <= after - timedelta(seconds=20)
    assert (held.expires_at - held.acquired_at).total_seconds() == pytest.approx(60)


def test_capabilities_say_one_process_no_server_clock_permits_and_marks() -> None:
    assert MemoryBackend.capabilities == Capabilities(
        cross_process=False, server_clock=False, dead_holders=True, permits=True, rerun=True
    )


def test_memory_backend_is_chosen_by_setting_and_shared_within_the_process() -> None:
    with override_settings(TASKLOCK_BACKEND="memory"):
        backend = get_backend()
        assert isinstance(backend, MemoryBackend)
        assert get_backend() is backend

        def work() -> tuple[bool, bool]:
            other_service = TaskLockService().run_exclusive("shared", lambda: "ran")
            return get_backend().peek("shared") is not None, other_service.acquired

        result = django_tasklock.run_exclusive("shared", work)
        assert result.acquired
        assert result.result == (True, False)  # seen held and refused by another service
        assert backend.acquire("kept", new_token(), ttl=timedelta(minutes=5), max_lifetime=LIFE)

        # Defaults are read per call: changing them keeps the backend and its locks.
        with override_settings(TASKLOCK_DEFAULTS={"ttl": 60}):
            assert get_backend() is backend
            assert backend.peek("kept") is not None

        # Changing what the backend is built from gives a fresh one.
        with override_settings(TASKLOCK_BACKEND="django_tasklock.backends.memory.MemoryBackend"):
            fresh = get_backend()
            assert isinstance(fresh, MemoryBackend)
            assert fresh is not backend
            assert fresh.peek("kept") is None
            assert get_backend() is fresh
