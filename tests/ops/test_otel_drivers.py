"""The lock's acquire span is the parent of the spans opentelemetry-instrumentation-psycopg
and -redis make for its storage calls (so a slow acquisition shows its statements)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from django.db import connections
from opentelemetry.trace import SpanKind

from django_tasklock import TaskLockService
from django_tasklock.testing import ContractBackend
from tests.conftest import database_backend, redis_backend, require_service
from tests.support.otel_support import Telemetry, children, eventually, observed

pytestmark = pytest.mark.databases


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    yield from observed()


@pytest.fixture
def postgres_store() -> ContractBackend:
    require_service("postgres")
    return database_backend("postgres")


def test_acquire_is_the_parent_of_psycopg_spans(
    postgres_store: ContractBackend, telemetry: Telemetry, key: str
) -> None:
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    instrumentor = PsycopgInstrumentor()
    instrumentor.instrument(tracer_provider=telemetry.tracer_provider, skip_dep_check=True)
    connections["postgres"].close()  # the next connection is made by the instrumented driver
    try:
        with TaskLockService(postgres_store.backend).lock(key, name="report"):
            pass
    finally:
        instrumentor.uninstrument()
        connections["postgres"].close()
    [acquire] = telemetry.finished("tasklock.acquire")
    below = children(telemetry, acquire)
    assert below, "no psycopg span under tasklock.acquire"
    assert all(span.kind is SpanKind.CLIENT for span in below)
    assert all((span.attributes or {}).get("db.system") == "postgresql" for span in below)


def test_acquire_is_the_parent_of_redis_spans(telemetry: Telemetry, key: str) -> None:
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    require_service("redis")
    instrumentor = RedisInstrumentor()
    instrumentor.instrument(tracer_provider=telemetry.tracer_provider, skip_dep_check=True)

    async def in_async_code(service: TaskLockService) -> None:
        async with service.lock(key, name="report"):  # storage calls off the event loop
            pass

    try:
        for store in redis_backend(key):
            service = TaskLockService(store.backend)
            with service.lock(key, name="report"):
                pass
            asyncio.run(in_async_code(service))
    finally:
        instrumentor.uninstrument()
    acquisitions = telemetry.finished("tasklock.acquire")
    assert len(acquisitions) == 2
    for acquire in acquisitions:
        below = children(telemetry, acquire)
        assert below, "no redis span under tasklock.acquire"
        assert all(span.kind is SpanKind.CLIENT for span in below)
        assert all((span.attributes or {}).get("db.system") == "redis" for span in below)


def test_the_heartbeat_span_is_the_parent_of_its_refreshes(telemetry: Telemetry, key: str) -> None:
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    require_service("redis")
    instrumentor = RedisInstrumentor()
    instrumentor.instrument(tracer_provider=telemetry.tracer_provider, skip_dep_check=True)
    try:
        for store in redis_backend(key):
            with TaskLockService(store.backend).lock(key, ttl=3, refresh_interval=0.2):
                eventually(lambda: bool(telemetry.finished("tasklock.heartbeat")))
    finally:
        instrumentor.uninstrument()
    tick = telemetry.finished("tasklock.heartbeat")[0]
    below = children(telemetry, tick)
    assert below, "no redis span under tasklock.heartbeat"
    assert all((span.attributes or {}).get("db.system") == "redis" for span in below)
