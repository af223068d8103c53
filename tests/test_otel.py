"""OpenTelemetry spans and metrics (contrib.otel), read back through the SDK's in-memory
exporter and reader, on SQLite, PostgreSQL, MariaDB and Redis."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    Histogram,
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    NumberDataPoint,
    Sum,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from django_tasklock import LockNotAcquired, TaskLockService
from django_tasklock.contrib import otel
from django_tasklock.testing import ContractBackend
from tests.conftest import database_backend, redis_backend, require_service

pytestmark = pytest.mark.databases

STORES = ["sqlite", "postgres", "mariadb", "redis"]


class Telemetry:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def finished(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.spans.get_finished_spans() if span.name == name]

    def metrics(self) -> dict[str, Metric]:
        data = self.reader.get_metrics_data()
        if data is None:
            return {}
        return {
            metric.name: metric
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }

    def points(self, name: str) -> dict[frozenset[tuple[str, Any]], Any]:
        metric = self.metrics().get(name)
        if metric is None:
            return {}
        return {frozenset((p.attributes or {}).items()): p for p in metric.data.data_points}


def attrs(**values: Any) -> frozenset[tuple[str, Any]]:
    return frozenset((f"tasklock.{k.replace('_', '.')}", v) for k, v in values.items())


def eventually(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    seen = Telemetry()
    otel.enable(seen.tracer_provider, seen.meter_provider)
    yield seen
    otel.disable()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, key: str) -> Iterator[ContractBackend]:
    name: str = request.param
    if name == "redis":
        require_service("redis")
        yield from redis_backend(key)
        return
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
    assert hold.start_time is not None and acquire.end_time is not None
    assert hold.start_time >= acquire.end_time

    metrics = telemetry.metrics()
    for name, unit, kind in [
        ("tasklock.acquire.duration", "s", Histogram),
        ("tasklock.hold.duration", "s", Histogram),
        ("tasklock.active", "{lock}", Sum),
    ]:
        assert metrics[name].unit == unit
        assert isinstance(metrics[name].data, kind)
    assert metrics["tasklock.active"].data.is_monotonic is False  # an up-down counter
    [duration] = telemetry.points("tasklock.acquire.duration").items()
    assert duration[0] == attrs(name="report", backend=backend_of(store), result="acquired")
    assert isinstance(duration[1], HistogramDataPoint) and duration[1].count == 1
    [held] = telemetry.points("tasklock.hold.duration").items()
    assert held[0] == attrs(name="report", backend=backend_of(store))
    assert held[1].count == 1
    [active] = telemetry.points("tasklock.active").values()
    assert isinstance(active, NumberDataPoint) and active.value == 0


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
    assert skipped.unit == "{call}" and skipped.data.is_monotonic is True  # a counter
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
    assert waiting.unit == "{caller}" and waiting.data.is_monotonic is False
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
    results = [s.attributes["tasklock.result"] for s in telemetry.finished("tasklock.acquire")]
    assert results == ["acquired", "acquired"]


def test_a_storage_error(store: ContractBackend, telemetry: Telemetry, key: str) -> None:
    assert store.unreachable is not None
    broken = store.unreachable()
    with pytest.raises(Exception) as raised:
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
    assert lost.unit == "{lock}" and lost.data.is_monotonic is True
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
    assert refreshed.min == 1 and refreshed.max == 1
