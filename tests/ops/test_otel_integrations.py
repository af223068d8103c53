"""``tasklock.name`` of the locks the task-framework integrations take, read back through
the OpenTelemetry SDK's in-memory exporter and reader: a dashboard tells one cron job, or
one Huey lock, from another."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_tasklock import lock
from tests.support import processes
from tests.support.otel_support import Telemetry, attrs, observed

pytestmark = pytest.mark.databases


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    yield from observed()


def names(telemetry: Telemetry, span: str) -> list[Any]:
    return [(s.attributes or {}).get("tasklock.name") for s in telemetry.finished(span)]


def test_a_django_cron_job_is_named_by_its_key(telemetry: Telemetry, key: str) -> None:
    """One key per job class (``django-cron:<code>``): its name, so that a skipped job
    or a long hold says which job."""
    processes.require_module("django_cron")
    from django_tasklock.contrib.django_cron import TaskLock

    job = type("Job", (), {"code": key, "__module__": "myapp.cron"})
    name = f"django-cron:{key}"
    with TaskLock(job, silent=True):
        skipped = TaskLock(job, silent=True)
        with pytest.raises(skipped.LockFailedException):
            skipped.__enter__()
    assert names(telemetry, "tasklock.acquire") == [name, name]
    assert names(telemetry, "tasklock.hold") == [name]
    [point] = telemetry.points("tasklock.skipped")
    assert point == attrs(name=name, backend="database", skipped_outcome="skipped")


def test_a_huey_lock_task_decorator_is_named_by_its_lock_name(
    telemetry: Telemetry, key: str
) -> None:
    """``@lock_task("reports")`` is the lock "reports", as Huey names it, not the function."""
    processes.require_module("huey")
    from huey.exceptions import TaskLockedException

    from django_tasklock.contrib.huey import lock_task

    @lock_task(key, ttl=60)
    def work() -> str:
        return "ran"

    assert work() == "ran"
    with lock(key, ttl=60), pytest.raises(TaskLockedException):
        work()
    assert names(telemetry, "tasklock.hold")[0] == key
    assert names(telemetry, "tasklock.acquire")[:3] == [key, None, key]  # None: the test's
    [point] = telemetry.points("tasklock.skipped")
    assert point == attrs(name=key, backend="database", skipped_outcome="skipped")
    # The context manager's name may be rendered per call (f"rebuild:{day}"): not reported.
    with lock_task(key, ttl=60):
        pass
    assert names(telemetry, "tasklock.hold")[-1] is None
