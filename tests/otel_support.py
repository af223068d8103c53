"""The OpenTelemetry SDK's in-memory exporter and reader, as the otel tests read them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Metric, Sum
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_tasklock.contrib import otel


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


def is_counter(metric: Metric, *, monotonic: bool) -> bool:
    """A counter (monotonic) or an up-down counter (not)."""
    return isinstance(metric.data, Sum) and metric.data.is_monotonic is monotonic


def attrs(**values: Any) -> frozenset[tuple[str, Any]]:
    return frozenset((f"tasklock.{k.replace('_', '.')}", v) for k, v in values.items())


def eventually(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


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
