"""A Dramatiq stub broker with a worker in this process, made the global broker for a test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def stub_broker(middleware: list[Any]) -> Iterator[Any]:
    """A ``StubBroker`` with ``middleware``, the global broker while it is used, and a
    worker of one thread serving it; the global broker put back after."""
    import dramatiq
    import dramatiq.broker
    from dramatiq.brokers.stub import StubBroker

    before = dramatiq.broker.global_broker
    broker = StubBroker(middleware=middleware)
    dramatiq.set_broker(broker)
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=1)
    worker.start()
    try:
        yield broker
    finally:
        worker.stop()
        broker.close()
        dramatiq.broker.global_broker = before
