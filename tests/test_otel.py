"""OpenTelemetry spans and metrics (contrib.otel), read back through the SDK's in-memory
exporter and reader, on SQLite, PostgreSQL, MariaDB and Redis."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from django.db import DatabaseError, connections
from opentelemetry.sdk.metrics.export import (
    Histogram,
    HistogramDataPoint,
    NumberDataPoint,
    Sum,
)
from opentelemetry.trace import SpanKind, StatusCode
from redis.exceptions import RedisError

from django_tasklock import LockNotAcquired, TaskLockService
from django_tasklock.contrib import otel_conventions
from django_tasklock.testing import ContractBackend
from tests.conftest import database_backend, redis_backend, require_service
from tests.otel_support import Telemetry, attrs, eventually, is_counter, observed

pytestmark = pytest.mark.databases

STORES = ["sqlite", "postgres", "mariadb", "redis"]


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    yield from observed()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, key: str) -> Iterator[ContractBackend]:
    name: str = request.param
    if name == "redis":
        require_service("redis")
        yield from redis_backend(key)
    else:
        if name != "sqlite":
            require_service(name)
        yield database_backend({"sqlite": "default"}.get(name, name))


def backend_of(store: ContractBackend) -> str:
    return "redis" if store.name == "redis" else "database"


def test_acquired(store: ContractBackend, telemetry: Telemetry, key: str) -> None:
    service = TaskLockService(store.backend)
    with service.lock(key, name="report", fencing=True) as lock:
        assert (
            telemetry.points("tasklock.active")[
                attrs(name="report", backend=backend_of(store))
            ].value
            == 1
        )
    named = {"tasklock.name": "report", "tasklock.backend": backend_of(store)}
    [acquire] = telemetry.finished("tasklock.acquire")
    assert acquire.kind is SpanKind.INTERNAL
    assert dict(acquire.attributes or {}) == {
        **named,
        "tasklock.result": "acquired",
        "tasklock.fence": lock.fence,
    }
    assert acquire.status.status_code is StatusCode.UNSET
    [hold] = telemetry.finished("tasklock.hold")
    assert hold.kind is SpanKind.INTERNAL
    assert dict(hold.attributes or {}) == {**named, "tasklock.fence": lock.fence}
    assert hold.status.status_code is StatusCode.UNSET
    assert hold.start_time is not None
    assert acquire.end_time is not None
    assert hold.start_time >= acquire.end_time

    metrics = telemetry.metrics()
    for name, unit, kind in [
        ("tasklock.acquire.duration", "s", Histogram),
        ("tasklock.hold.duration", "s", Histogram),
        ("tasklock.active", "{lock}", Sum),
    ]:
        assert metrics[name].unit == unit
        assert isinstance(metrics[name].data, kind)
    assert is_counter(metrics["tasklock.active"], monotonic=False)  # an up-down counter
    [duration] = telemetry.points("tasklock.acquire.duration").items()
    assert duration[0] == attrs(name="report", backend=backend_of(store), result="acquired")
    assert isinstance(duration[1], HistogramDataPoint)
    assert (
        tuple(duration[1].explicit_bounds) == otel_conventions.SECONDS
    )  # seconds, not milliseconds
    assert duration[1].count == 1
    [held] = telemetry.points("tasklock.hold.duration").items()
    assert held[0] == attrs(name="report", backend=backend_of(store))
    assert held[1].count == 1
    [active] = telemetry.points("tasklock.active").values()
    assert isinstance(active, NumberDataPoint)
    assert active.value == 0


def test_held_elsewhere_is_no_error(
    store: ContractBackend, telemetry: Telemetry, key: str
) -> None:
    service = TaskLockService(store.backend)
    with service.lock(key, name="report"):
        assert not service.run_exclusive(key, lambda: None, name="report").acquired
    outcomes = {
        span.attributes["tasklock.result"]: span
        for span in telemetry.finished("tasklock.acquire")
        if span.attributes
    }
    assert set(outcomes) == {"acquired", "held_elsewhere"}
    assert outcomes["held_elsewhere"].status.status_code is StatusCode.UNSET
    assert len(telemetry.finished("tasklock.hold")) == 1
    found = attrs(name="report", backend=backend_of(store))
    assert set(telemetry.points("tasklock.acquire.duration")) == {
        found | attrs(result="acquired"),
        found | attrs(result="held_elsewhere"),
    }
    skipped = telemetry.metrics()["tasklock.skipped"]
    assert skipped.unit == "{call}"
    assert is_counter(skipped, monotonic=True)
    assert {k: p.value for k, p in telemetry.points("tasklock.skipped").items()} == {found: 1}


def test_a_wait_that_times_out(store: ContractBackend, telemetry: Telemetry, key: str) -> None:
    service = TaskLockService(store.backend)
    with service.lock(key, name="report"), pytest.raises(LockNotAcquired):
        service.lock(key, name="report", wait=0.3).acquire()
    found = attrs(name="report", backend=backend_of(store))
    [timeout] = [
        span
        for span in telemetry.finished("tasklock.acquire")
        if span.attributes and span.attributes["tasklock.result"] == "timeout"
    ]
    assert timeout.status.status_code is StatusCode.UNSET
    assert (
        telemetry.points("tasklock.acquire.duration")[found | attrs(result="timeout")].sum >= 0.3
    )
    waiting = telemetry.metrics()["tasklock.waiting"]
    assert waiting.unit == "{caller}"
    assert is_counter(waiting, monotonic=False)
    assert telemetry.points("tasklock.waiting")[found].value == 0  # waited, then gave up


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
        eventually(
            lambda: getattr(telemetry.points("tasklock.waiting").get(found), "value", 0) == 1
        )
    finally:
        holder.release()
        thread.join(30)
    assert telemetry.points("tasklock.waiting")[found].value == 0
    results = [
        (s.attributes or {})["tasklock.result"] for s in telemetry.finished("tasklock.acquire")
    ]
    assert results == ["acquired", "acquired"]


def test_a_storage_error(store: ContractBackend, telemetry: Telemetry, key: str) -> None:
    assert store.unreachable is not None
    broken = store.unreachable()
    with pytest.raises((DatabaseError, RedisError)) as raised:
        TaskLockService(broken).lock(key, name="report").acquire()
    [acquire] = telemetry.finished("tasklock.acquire")
    assert acquire.status.status_code is StatusCode.ERROR
    error = type(raised.value)
    assert acquire.attributes is not None
    assert acquire.attributes["error.type"] == f"{error.__module__}.{error.__name__}"
    assert acquire.attributes["tasklock.result"] == "error"
    assert [event.name for event in acquire.events] == ["exception"]
    found = attrs(name="report", backend=backend_of(store))
    assert set(telemetry.points("tasklock.acquire.duration")) == {found | attrs(result="error")}
    assert telemetry.finished("tasklock.hold") == []


def test_a_loss(store: ContractBackend, telemetry: Telemetry, key: str) -> None:
    service = TaskLockService(store.backend)
    with service.lock(key, name="report", ttl=3, refresh_interval=0.2) as lock:
        store.backend.force_release(key)  # an operator's release: the next refresh finds it
        assert lock.lost_event.wait(15)
    [hold] = telemetry.finished("tasklock.hold")
    assert hold.status.status_code is StatusCode.ERROR
    assert hold.attributes is not None
    assert hold.attributes["tasklock.lost.reason"] == "released_by_operator"
    assert hold.attributes["error.type"] == "released_by_operator"
    lost = telemetry.metrics()["tasklock.lost"]
    assert lost.unit == "{lock}"
    assert is_counter(lost, monotonic=True)
    found = attrs(name="report", backend=backend_of(store))
    assert {k: p.value for k, p in telemetry.points("tasklock.lost").items()} == {
        found | {("tasklock.lost.reason", "released_by_operator")}: 1
    }


def test_a_heartbeat_tick(store: ContractBackend, telemetry: Telemetry, key: str) -> None:
    service = TaskLockService(store.backend)
    with service.lock(key, name="report", ttl=3, refresh_interval=0.2):
        eventually(lambda: bool(telemetry.finished("tasklock.heartbeat")))
    tick = telemetry.finished("tasklock.heartbeat")[0]
    assert tick.kind is SpanKind.INTERNAL
    assert dict(tick.attributes or {}) == {
        "tasklock.backend": backend_of(store),
        "tasklock.heartbeat.leases": 1,
    }
    metrics = telemetry.metrics()
    assert metrics["tasklock.heartbeat.duration"].unit == "s"
    assert metrics["tasklock.heartbeat.leases"].unit == "{lease}"
    for name in ("tasklock.heartbeat.duration", "tasklock.heartbeat.leases"):
        assert isinstance(metrics[name].data, Histogram)
        assert set(telemetry.points(name)) == {attrs(backend=backend_of(store))}
    refreshed = telemetry.points("tasklock.heartbeat.leases")[attrs(backend=backend_of(store))]
    assert refreshed.min == 1
    assert refreshed.max == 1
