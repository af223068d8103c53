"""OpenTelemetry on the unhappy paths: errors whose text names the key, and async
acquisitions cancelled while they wait, read back through the SDK's in-memory
exporter and reader."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.trace import StatusCode

from django_tasklock import ReplicationNotConfirmed, TaskLockService
from django_tasklock.backends.redis import RedisBackend
from tests.conftest import require_service
from tests.otel_support import Telemetry, observed
from tests.replication import close
from tests.servers import private_redis

pytestmark = pytest.mark.databases


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    yield from observed()


def test_an_error_whose_text_names_the_key_puts_no_key_on_the_span(
    telemetry: Telemetry, key: str
) -> None:
    """A master with no replica and ``min_replicas=1``: the grant is never confirmed, and
    ``ReplicationNotConfirmed`` says so naming the key. The span keeps the error's type
    and text, without the key: "never a raw key" holds for the status and the event too."""
    require_service("redis")
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
    assert key not in acquire.to_json()
