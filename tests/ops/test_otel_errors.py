"""OpenTelemetry on the unhappy paths: errors whose text names the key, and async
acquisitions cancelled while they wait, read back through the SDK's in-memory
exporter and reader."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from opentelemetry.trace import Span, StatusCode

from django_tasklock import ReplicationNotConfirmed, TaskLockService
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.locking import aio
from django_tasklock.testing import ContractBackend
from tests.conftest import require_service
from tests.support.otel_support import (
    STORES,
    Telemetry,
    attrs,
    backend_of,
    lock_metrics,
    lock_span,
    lock_spans,
    metric_records,
    observed,
    open_store,
)
from tests.support.replication import close
from tests.support.servers import private_redis

pytestmark = pytest.mark.databases


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    yield from observed()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, key: str) -> Iterator[ContractBackend]:
    yield from open_store(request.param, key)


@pytest.mark.parametrize("short", [False, True])
def test_an_error_whose_text_names_the_key_puts_no_key_on_the_span(
    telemetry: Telemetry, key: str, short: bool
) -> None:
    """A master with no replica and ``min_replicas=1``: the grant is never confirmed, and
    ``ReplicationNotConfirmed`` says so naming the key. The span keeps the error's type
    and text, without the key: "never a raw key" holds for the status and the event too."""
    require_service("redis")
    key = "e" if short else key  # a one-letter key: the rest of the text stays readable
    with private_redis() as master:
        backend = RedisBackend(url=master.url, min_replicas=1, replica_timeout=0.2)
        try:
            with pytest.raises(ReplicationNotConfirmed, match=key):
                TaskLockService(backend).lock(key, name="report").acquire()
        finally:
            close(backend)
    [acquire] = telemetry.finished("tasklock.acquire")
    assert acquire.status.status_code is StatusCode.ERROR
    assert acquire.attributes is not None
    assert acquire.attributes["error.type"] == "django_tasklock.exceptions.ReplicationNotConfirmed"
    assert acquire.attributes["tasklock.result"] == "error"
    [event] = acquire.events
    assert event.name == "exception"
    assert event.attributes is not None
    assert "was not acquired" in str(event.attributes["exception.message"])
    assert "ReplicationNotConfirmed" in str(event.attributes["exception.stacktrace"])
    assert "was not acquired" in str(acquire.status.description)
    assert str(acquire.status.description).startswith("Task lock <key> was not acquired: ")
    if not short:
        assert key not in acquire.to_json()


def test_an_async_waiter_cancelled_leaves_no_span_open_and_no_count_behind(
    telemetry: Telemetry, key: str
) -> None:
    """Cancelled while it waits for a held key, and cancelled while its attempt is
    under way (the attempt finishes in its thread, and what it took is released):
    every span ends, and ``tasklock.waiting`` and ``tasklock.active`` come back to 0."""
    service = TaskLockService()
    found = attrs(name="report", backend="database")

    async def cancelled(lock: Any, after: float) -> None:
        task = asyncio.ensure_future(lock.aacquire())
        await asyncio.sleep(after)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def main() -> None:
        holder = service.lock(key, name="report")
        await holder.aacquire()
        await cancelled(service.lock(key, name="report", wait=30), 0.5)  # waiting
        assert telemetry.points("tasklock.waiting")[found].value == 0
        await holder.arelease()
        for n in range(5):  # in flight: the attempt may grant, then be released
            await cancelled(service.lock(f"{key}-{n}", name="report"), 0)
        while aio._background:
            await asyncio.sleep(0.05)

    asyncio.run(main())
    connections.close_all()  # sync_to_async's thread's connections
    assert telemetry.points("tasklock.waiting")[found].value == 0
    assert telemetry.points("tasklock.active")[found].value == 0
    acquires = telemetry.finished("tasklock.acquire")
    assert len(acquires) == 7
    holds = telemetry.finished("tasklock.hold")
    granted = [s for s in acquires if (s.attributes or {})["tasklock.result"] == "acquired"]
    assert len(holds) == len(granted) >= 1


def test_a_cancelled_async_waiter_is_an_error_of_its_class(
    store: ContractBackend, telemetry: Telemetry, key: str
) -> None:
    """An acquisition its caller interrupts (a task cancelled while it waits for a held
    key; a ``KeyboardInterrupt`` alike) failed, as OpenTelemetry records an exception
    leaving an operation: result ``error``, status ERROR, ``error.type`` the class."""
    service = TaskLockService(store.backend)
    found = attrs(name="report", backend=backend_of(store))

    def waiting() -> float:
        return getattr(telemetry.points("tasklock.waiting").get(found), "value", 0)

    async def main() -> Span:
        with telemetry.work() as work:
            holder = service.lock(key, name="report")
            await holder.aacquire()
            waiter = asyncio.ensure_future(service.lock(key, name="report", wait=30).aacquire())
            deadline = asyncio.get_running_loop().time() + 15
            while waiting() != 1:  # cancelled while it waits, not during its first look
                assert asyncio.get_running_loop().time() < deadline, "it never waited"
                await asyncio.sleep(0.02)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            await holder.arelease()
        # The connections of the thread the storage calls ran in (off_loop's).
        await sync_to_async(connections.close_all, thread_sensitive=True)()
        return work

    work = asyncio.run(main())
    cancelled = {
        **dict(found | attrs(result="error")),
        "error.type": "asyncio.exceptions.CancelledError",
    }
    assert lock_spans(telemetry) == [
        lock_span("tasklock.acquire", found | attrs(result="acquired"), parent=work),
        lock_span(
            "tasklock.acquire",
            cancelled,
            parent=work,
            status=StatusCode.ERROR,
            events=("exception",),
        ),
        lock_span("tasklock.hold", found, parent=work),
    ]
    assert metric_records(telemetry) == lock_metrics(
        {
            "tasklock.acquire.duration": {
                found | attrs(result="acquired"): 1,
                found | attrs(result="error"): 1,
            },
            "tasklock.waiting": {found: 0},
            "tasklock.hold.duration": {found: 1},
            "tasklock.active": {found: 0},
        }
    )
