"""The OpenTelemetry SDK's in-memory exporter and reader, as the otel tests read them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

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
from opentelemetry.trace import Span, SpanKind, StatusCode

from django_tasklock.contrib import otel
from django_tasklock.leases.heartbeat import heartbeat
from django_tasklock.testing import ContractBackend
from tests.conftest import database_backend, redis_backend, require_service

#: The stores the otel tests run on (``store`` fixtures, through :func:`open_store`).
STORES = ["sqlite", "postgres", "mariadb", "redis"]


def open_store(name: str, key: str) -> Iterator[ContractBackend]:
    """For a ``store`` fixture: one of :data:`STORES` (skipped when its service is missing)."""
    if name == "redis":
        require_service("redis")
        yield from redis_backend(key)
    else:
        if name != "sqlite":
            require_service(name)
        yield database_backend({"sqlite": "default"}.get(name, name))


def backend_of(store: ContractBackend) -> str:
    """``tasklock.backend`` of ``store``'s backend."""
    return "redis" if store.name == "redis" else "database"


class Telemetry:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def work(self) -> AbstractContextManager[Span]:
        """The caller's own span (current while it is open): the lock's spans go under it."""
        return self.tracer_provider.get_tracer("tests").start_as_current_span("work")

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


#: The instruments issue 18 asks for, spelled out here rather than read from
#: ``otel_conventions``: name -> (unit, instrument).
INSTRUMENTS = {
    "tasklock.acquire.duration": ("s", "histogram"),
    "tasklock.hold.duration": ("s", "histogram"),
    "tasklock.active": ("{lock}", "up-down counter"),
    "tasklock.waiting": ("{caller}", "up-down counter"),
    "tasklock.lost": ("{lock}", "counter"),
    "tasklock.skipped": ("{call}", "counter"),
    "tasklock.heartbeat.duration": ("s", "histogram"),
    "tasklock.heartbeat.leases": ("{lease}", "histogram"),
}


def instrument(metric: Metric) -> str:
    """``histogram``, ``counter`` or ``up-down counter``, as the SDK exported it."""
    if isinstance(metric.data, Histogram):
        return "histogram"
    if isinstance(metric.data, Sum):
        return "counter" if metric.data.is_monotonic else "up-down counter"
    return type(metric.data).__name__


def metric_records(telemetry: Telemetry) -> dict[str, dict[str, Any]]:
    """Every metric exported: its unit, instrument and points, each point's attributes
    to its count (a histogram) or value (a counter)."""
    return {
        name: {
            "unit": metric.unit,
            "instrument": instrument(metric),
            "points": {
                frozenset((p.attributes or {}).items()): _count(p) for p in metric.data.data_points
            },
        }
        for name, metric in telemetry.metrics().items()
    }


def _count(point: object) -> float:
    if isinstance(point, HistogramDataPoint):
        return point.count
    assert isinstance(point, NumberDataPoint), point
    return point.value


def lock_metrics(points: dict[str, dict[frozenset[tuple[str, Any]], Any]]) -> dict[str, Any]:
    """What :func:`metric_records` should give: ``points`` per metric, under the unit and
    instrument of :data:`INSTRUMENTS`."""
    return {
        name: {"unit": INSTRUMENTS[name][0], "instrument": INSTRUMENTS[name][1], "points": found}
        for name, found in points.items()
    }


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """What a test asserts of a span: all but its times and its own ids."""
    return {
        "name": span.name,
        "kind": span.kind,
        "status": span.status.status_code,
        "attributes": dict(span.attributes or {}),
        "parent": None if span.parent is None else span.parent.span_id,
        "events": [event.name for event in span.events],
    }


def lock_span(
    name: str,
    attributes: dict[str, Any] | frozenset[tuple[str, Any]],
    *,
    parent: Span | None,
    status: StatusCode = StatusCode.UNSET,
    events: tuple[str, ...] = (),
) -> dict[str, Any]:
    """What :func:`span_record` should give for one of the lock's spans (all INTERNAL)."""
    return {
        "name": name,
        "kind": SpanKind.INTERNAL,
        "status": status,
        "attributes": dict(attributes),
        "parent": None if parent is None else parent.get_span_context().span_id,
        "events": list(events),
    }


def lock_spans(telemetry: Telemetry, *, heartbeat: bool = False) -> list[dict[str, Any]]:
    """:func:`span_record` of each finished ``tasklock.*`` span, in the order they ended
    (the heartbeat's only with ``heartbeat=True``)."""
    return [
        span_record(span)
        for span in telemetry.spans.get_finished_spans()
        if span.name.startswith("tasklock.") and (heartbeat or span.name != "tasklock.heartbeat")
    ]


def is_counter(metric: Metric, *, monotonic: bool) -> bool:
    """A counter (monotonic) or an up-down counter (not)."""
    return isinstance(metric.data, Sum) and metric.data.is_monotonic is monotonic


def attrs(**values: Any) -> frozenset[tuple[str, Any]]:
    return frozenset((f"tasklock.{k.replace('_', '.')}", v) for k, v in values.items())


def eventually(
    condition: Callable[[], bool],
    timeout: float = 15.0,
    describe: Callable[[], object] | None = None,
) -> None:
    """Wait for ``condition``; past ``timeout``, fail with what ``describe`` says then."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            found = "" if describe is None else f": {describe()!r}"
            raise AssertionError(f"condition not met in time{found}")
        time.sleep(0.05)


def open_leases() -> list[tuple[str, str]]:
    """(key, backend class) of each lease this process's heartbeat keeps: those on its
    heap not released, and those of a tick under way, released or not (the tick may
    yet be recorded)."""
    beat = heartbeat()
    with beat._mutex:
        queued = [x for _, _, group in beat._heap for x in group if not x.closed]
        leases = queued + beat._taken
    return [(x.key, type(x.backend).__name__) for x in leases]


def heartbeat_quiet() -> None:
    """Wait until this process's heartbeat keeps no lease: a test that counts every
    tick must not count those of an earlier test's lease, still being released."""
    eventually(lambda: not open_leases(), timeout=30, describe=open_leases)


def tick_leases(telemetry: Telemetry) -> list[tuple[object, object]]:
    """Per finished tick, its backend and how many leases it refreshed: what a failed
    wait for the ticks says."""
    return [
        (
            (span.attributes or {}).get("tasklock.backend"),
            (span.attributes or {}).get("tasklock.heartbeat.leases"),
        )
        for span in telemetry.finished("tasklock.heartbeat")
    ]


def children(telemetry: Telemetry, parent: ReadableSpan) -> list[ReadableSpan]:
    """The finished spans whose parent is ``parent``."""
    assert parent.context is not None
    return [
        span
        for span in telemetry.spans.get_finished_spans()
        if span.parent is not None and span.parent.span_id == parent.context.span_id
    ]


def observed() -> Iterator[Telemetry]:
    """For a ``telemetry`` fixture: every lock observed through fresh in-memory providers."""
    seen = Telemetry()
    otel.enable(seen.tracer_provider, seen.meter_provider)
    yield seen
    otel.disable()
