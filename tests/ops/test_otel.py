"""OpenTelemetry spans and metrics (contrib.otel), read back through the SDK's in-memory
exporter and reader, on SQLite, PostgreSQL, MariaDB and Redis.

Each outcome asserts its whole record: every ``tasklock.*`` span (name, kind, status,
attributes, parent, events) and every metric (name, unit, instrument, the attributes
of each point and its count), as ``lock_span`` and ``lock_metrics`` describe them.
The lock is taken under a span of the caller's (``work``), which is the parent of the
lock's spans; the heartbeat's have none (they run on its own thread).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from django.db import DatabaseError, connections
from opentelemetry.trace import StatusCode
from redis.exceptions import RedisError

from django_tasklock import LockNotAcquired, TaskLockService
from django_tasklock.contrib import otel_conventions
from django_tasklock.testing import ContractBackend
from tests.support.otel_support import (
    STORES,
    Telemetry,
    attrs,
    backend_of,
    eventually,
    heartbeat_quiet,
    lock_metrics,
    lock_span,
    lock_spans,
    metric_records,
    observed,
    open_store,
    tick_leases,
)

pytestmark = pytest.mark.databases

ACQUIRE, HOLD, BEAT = "tasklock.acquire", "tasklock.hold", "tasklock.heartbeat"
ACQUIRE_DURATION, HOLD_DURATION = "tasklock.acquire.duration", "tasklock.hold.duration"
ACTIVE, WAITING = "tasklock.active", "tasklock.waiting"
BEAT_DURATION, BEAT_LEASES = "tasklock.heartbeat.duration", "tasklock.heartbeat.leases"


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    # Not one tick of an earlier test's lease (still being released) in this test's.
    heartbeat_quiet()
    yield from observed()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, key: str) -> Iterator[ContractBackend]:
    yield from open_store(request.param, key)


def test_acquired(store: ContractBackend, telemetry: Telemetry, key: str) -> None:
    found = attrs(name="report", backend=backend_of(store))
    with (
        telemetry.work() as work,
        TaskLockService(store.backend).lock(key, name="report", fencing=True) as lock,
    ):
        assert telemetry.points(ACTIVE)[found].value == 1
    fenced = found | attrs(fence=lock.fence)
    assert lock_spans(telemetry) == [
        lock_span(ACQUIRE, fenced | attrs(result="acquired"), parent=work),
        lock_span(HOLD, fenced, parent=work),
    ]
    [acquire] = telemetry.finished(ACQUIRE)
    [hold] = telemetry.finished(HOLD)
    assert hold.start_time is not None
    assert acquire.end_time is not None
    assert hold.start_time >= acquire.end_time  # a sibling, after it
    assert metric_records(telemetry) == lock_metrics(
        {
            ACQUIRE_DURATION: {found | attrs(result="acquired"): 1},
            HOLD_DURATION: {found: 1},
            ACTIVE: {found: 0},
        }
    )
    [duration] = telemetry.points(ACQUIRE_DURATION).values()
    assert tuple(duration.explicit_bounds) == otel_conventions.SECONDS  # seconds, not ms


def test_a_permit_says_its_limit_on_spans_and_its_number_on_the_hold(
    store: ContractBackend, telemetry: Telemetry, key: str
) -> None:
    """``limit=3``: ``tasklock.limit`` on both spans, ``tasklock.permit`` on the hold;
    the metrics keep the mutex's attributes (no new series)."""
    found = attrs(name="export", backend=backend_of(store))
    with (
        telemetry.work() as work,
        TaskLockService(store.backend).lock(key, name="export", limit=3) as lock,
    ):
        assert telemetry.points(ACTIVE)[found].value == 1
    assert lock.permit == 0
    assert lock_spans(telemetry) == [
        lock_span(ACQUIRE, found | attrs(limit=3, result="acquired"), parent=work),
        lock_span(HOLD, found | attrs(limit=3, permit=0), parent=work),
    ]
    assert metric_records(telemetry) == lock_metrics(
        {
            ACQUIRE_DURATION: {found | attrs(result="acquired"): 1},
            HOLD_DURATION: {found: 1},
            ACTIVE: {found: 0},
        }
    )


def test_held_elsewhere_is_no_error(
    store: ContractBackend, telemetry: Telemetry, key: str
) -> None:
    service = TaskLockService(store.backend)
    with telemetry.work() as work, service.lock(key, name="report"):
        assert not service.run_exclusive(key, lambda: None, name="report").acquired
    found = attrs(name="report", backend=backend_of(store))
    assert lock_spans(telemetry) == [
        lock_span(ACQUIRE, found | attrs(result="acquired"), parent=work),
        lock_span(ACQUIRE, found | attrs(result="held_elsewhere"), parent=work),  # UNSET
        lock_span(HOLD, found, parent=work),
    ]
    assert metric_records(telemetry) == lock_metrics(
        {
            ACQUIRE_DURATION: {
                found | attrs(result="acquired"): 1,
                found | attrs(result="held_elsewhere"): 1,
            },
            HOLD_DURATION: {found: 1},
            ACTIVE: {found: 0},
            "tasklock.skipped": {found | attrs(skipped_outcome="skipped"): 1},
        }
    )


def test_a_call_that_marks_the_key_to_run_once_more_is_counted_so(
    store: ContractBackend, telemetry: Telemetry, key: str
) -> None:
    service = TaskLockService(store.backend)
    with service.lock(key, name="rebuild"):
        assert service.run_exclusive(key, lambda: None, name="rebuild", on_locked="rerun").rerun
    found = attrs(name="rebuild", backend=backend_of(store))
    assert list(telemetry.points("tasklock.skipped")) == [found | attrs(skipped_outcome="rerun")]


def test_a_wait_that_times_out(store: ContractBackend, telemetry: Telemetry, key: str) -> None:
    service = TaskLockService(store.backend)
    with (
        telemetry.work() as work,
        service.lock(key, name="report"),
        pytest.raises(LockNotAcquired),
    ):
        # A budget the first look cannot use up on a loaded machine: with 0.3 s, a
        # first look on SQLite that took longer timed out before any wait, and
        # tasklock.waiting was never recorded (bare-machine CI step, loaded).
        service.lock(key, name="report", wait=2).acquire()
    found = attrs(name="report", backend=backend_of(store))
    assert lock_spans(telemetry) == [
        lock_span(ACQUIRE, found | attrs(result="acquired"), parent=work),
        lock_span(ACQUIRE, found | attrs(result="timeout"), parent=work),  # UNSET
        lock_span(HOLD, found, parent=work),
    ]
    assert metric_records(telemetry) == lock_metrics(
        {
            ACQUIRE_DURATION: {
                found | attrs(result="acquired"): 1,
                found | attrs(result="timeout"): 1,
            },
            WAITING: {found: 0},  # waited, then gave up
            HOLD_DURATION: {found: 1},
            ACTIVE: {found: 0},
        }
    )
    assert telemetry.points(ACQUIRE_DURATION)[found | attrs(result="timeout")].sum >= 0.3


def test_waiting_counts_a_waiter_until_it_acquires(
    store: ContractBackend, telemetry: Telemetry, key: str
) -> None:
    service = TaskLockService(store.backend)
    found = attrs(name="report", backend=backend_of(store))
    holder = service.lock(key, name="report").acquire()
    waiter = service.lock(key, name="report", wait=30)

    def wait_then_release() -> None:
        try:
            waiter.acquire().release()
        finally:
            connections.close_all()  # this thread's own connections

    thread = threading.Thread(target=wait_then_release)
    thread.start()
    try:
        eventually(lambda: getattr(telemetry.points(WAITING).get(found), "value", 0) == 1)
    finally:
        holder.release()
        thread.join(30)
    assert telemetry.points(WAITING)[found].value == 0
    results = [(s.attributes or {})["tasklock.result"] for s in telemetry.finished(ACQUIRE)]
    assert results == ["acquired", "acquired"]


def test_a_storage_error(store: ContractBackend, telemetry: Telemetry, key: str) -> None:
    assert store.unreachable is not None
    broken = store.unreachable()
    with telemetry.work() as work, pytest.raises((DatabaseError, RedisError)) as raised:
        TaskLockService(broken).lock(key, name="report").acquire()
    error = type(raised.value)
    found = attrs(name="report", backend=backend_of(store))
    failed = {
        **dict(found | attrs(result="error")),
        "error.type": f"{error.__module__}.{error.__name__}",
    }
    assert lock_spans(telemetry) == [
        lock_span(ACQUIRE, failed, parent=work, status=StatusCode.ERROR, events=("exception",))
    ]
    assert metric_records(telemetry) == lock_metrics(
        {ACQUIRE_DURATION: {found | attrs(result="error"): 1}}
    )


def _ticks_settled(telemetry: Telemetry, last_leases: int) -> bool:
    """Every tick that ended has recorded its measurements, and the last one refreshed
    ``last_leases`` leases (a tick records them just before its span ends)."""
    ticks = telemetry.finished(BEAT)
    recorded = telemetry.points(BEAT_DURATION)
    return (
        bool(ticks)
        and sum(point.count for point in recorded.values()) == len(ticks)
        and (ticks[-1].attributes or {}).get("tasklock.heartbeat.leases") == last_leases
    )


def test_a_loss(store: ContractBackend, telemetry: Telemetry, key: str) -> None:
    service = TaskLockService(store.backend)
    with (
        telemetry.work() as work,
        service.lock(key, name="report", ttl=3, refresh_interval=0.2) as lock,
    ):
        store.backend.force_release(key)  # an operator's release: the next refresh finds it
        assert lock.lost_event.wait(15)
    eventually(
        lambda: _ticks_settled(telemetry, last_leases=0), describe=lambda: tick_leases(telemetry)
    )
    found = attrs(name="report", backend=backend_of(store))
    lost = found | attrs(lost_reason="released_by_operator")
    assert lock_spans(telemetry) == [
        lock_span(ACQUIRE, found | attrs(result="acquired"), parent=work),
        lock_span(
            HOLD,
            {**dict(lost), "error.type": "released_by_operator"},
            parent=work,
            status=StatusCode.ERROR,
        ),
    ]
    [hold] = telemetry.finished(HOLD)
    assert hold.status.description == "lease lost: released_by_operator"
    # Refreshed until a tick found it gone (refreshing none), then no longer ticked.
    ticks = [s for s in lock_spans(telemetry, heartbeat=True) if s["name"] == BEAT]
    leases = [tick["attributes"]["tasklock.heartbeat.leases"] for tick in ticks]
    assert leases == [1] * (len(ticks) - 1) + [0]
    assert ticks == [
        lock_span(BEAT, attrs(backend=backend_of(store), heartbeat_leases=n), parent=None)
        for n in leases
    ]
    beat = attrs(backend=backend_of(store))
    assert metric_records(telemetry) == lock_metrics(
        {
            ACQUIRE_DURATION: {found | attrs(result="acquired"): 1},
            HOLD_DURATION: {found: 1},
            ACTIVE: {found: 0},
            "tasklock.lost": {lost: 1},
            BEAT_DURATION: {beat: len(ticks)},
            BEAT_LEASES: {beat: len(ticks)},
        }
    )


def test_a_heartbeat_tick(store: ContractBackend, telemetry: Telemetry, key: str) -> None:
    # One tick a second: released as soon as the first has ended, before the next.
    with (
        telemetry.work() as work,
        TaskLockService(store.backend).lock(key, name="report", ttl=3, refresh_interval=1),
    ):
        eventually(lambda: bool(telemetry.finished(BEAT)))
    eventually(
        lambda: _ticks_settled(telemetry, last_leases=1), describe=lambda: tick_leases(telemetry)
    )
    found = attrs(name="report", backend=backend_of(store))
    beat = attrs(backend=backend_of(store))
    ticks = telemetry.finished(BEAT)  # one, unless this thread was held up for a second
    assert lock_spans(telemetry, heartbeat=True) == [
        lock_span(ACQUIRE, found | attrs(result="acquired"), parent=work),
        *[lock_span(BEAT, beat | attrs(heartbeat_leases=1), parent=None) for _ in ticks],
        lock_span(HOLD, found, parent=work),
    ]
    assert metric_records(telemetry) == lock_metrics(
        {
            ACQUIRE_DURATION: {found | attrs(result="acquired"): 1},
            HOLD_DURATION: {found: 1},
            ACTIVE: {found: 0},
            BEAT_DURATION: {beat: len(ticks)},
            BEAT_LEASES: {beat: len(ticks)},
        }
    )
    refreshed = telemetry.points(BEAT_LEASES)[beat]
    assert (refreshed.min, refreshed.max) == (1, 1)
