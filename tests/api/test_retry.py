"""``on_locked="retry"``: the skip reported, then the running task's framework asked to retry it.

The frameworks' own retriers run with real workers in tests/frameworks; here
a retrier of a test's own stands in for a framework, and code that runs in
no task gets ``RetryUnavailable``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from django_tasklock import TaskLockService, exclusive
from django_tasklock.api import retrying
from django_tasklock.api.retrying import RetryBackoff, RetryPlan
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.exceptions import RetryUnavailable


class Retried(Exception):
    """What the stand-in framework raises to retry its task."""


class StandIn:
    """A framework whose task runs its ``attempt``-th try now (None: no task runs)."""

    def __init__(self) -> None:
        self.attempt: int | None = None
        self.asked: list[float] = []

    def __call__(self, backoff: RetryBackoff) -> RetryPlan | None:
        if self.attempt is None:
            return None
        if self.attempt >= backoff.tries:
            return RetryPlan("Stand-in", self.attempt, None, lambda: None)
        countdown = backoff.countdown(self.attempt)

        def act() -> Any:
            self.asked.append(countdown)
            raise Retried

        return RetryPlan("Stand-in", self.attempt, countdown, act)


@pytest.fixture
def framework() -> Iterator[StandIn]:
    stand_in = StandIn()
    retrying.register(stand_in)
    yield stand_in
    retrying._retriers.remove(stand_in)


def test_a_held_key_asks_the_running_tasks_framework_for_a_retry(
    framework: StandIn, skipped: list[dict[str, Any]], key: str, caplog: pytest.LogCaptureFixture
) -> None:
    service = TaskLockService(MemoryBackend())
    runs: list[int] = []

    @exclusive(key, on_locked="retry", service=service)
    def task() -> None:
        runs.append(1)

    framework.attempt = 1
    with (
        service.lock(key),
        caplog.at_level(logging.INFO, "django_tasklock"),
        pytest.raises(Retried),
    ):
        task()
    assert runs == []
    assert len(framework.asked) == 1
    assert 0.5 <= framework.asked[0] <= 1.0  # try 1: 1 s, jittered down by up to half
    assert [s["outcome"] for s in skipped] == ["retry"]
    assert "Stand-in runs it again in" in caplog.text
    assert "(try 2 of 8)" in caplog.text
    task()  # the key free: the retry runs
    assert runs == [1]


def test_the_last_try_ends_as_skipped(
    framework: StandIn, skipped: list[dict[str, Any]], key: str
) -> None:
    service = TaskLockService(MemoryBackend())

    @exclusive(key, on_locked="retry", service=service)
    def task() -> str:
        return "ran"  # pragma: no cover - never runs: the key is held

    framework.attempt = RetryBackoff().tries
    with service.lock(key):
        assert task() is None
    assert framework.asked == []
    assert [s["outcome"] for s in skipped] == ["skipped"]


def test_outside_a_task_it_is_refused_saying_what_to_use(
    framework: StandIn, skipped: list[dict[str, Any]], key: str
) -> None:
    service = TaskLockService(MemoryBackend())

    @exclusive(key, on_locked="retry", service=service)
    def task() -> str:
        return "ran"

    assert task() == "ran"  # the key free: no framework asked
    with service.lock(key), pytest.raises(RetryUnavailable, match="on_locked='rerun', wait="):
        task()
    assert [s["outcome"] for s in skipped] == ["skipped"]


def test_async_functions_are_retried_too(framework: StandIn, key: str) -> None:
    import asyncio

    service = TaskLockService(MemoryBackend())

    @exclusive(key, on_locked="retry", service=service)
    async def task() -> str:
        return "ran"  # pragma: no cover - never runs: the key is held

    framework.attempt = 3
    with service.lock(key), pytest.raises(Retried):
        asyncio.run(task())
    assert 2.0 <= framework.asked[0] <= 4.0  # try 3: 4 s, jittered down by up to half


def test_run_exclusive_takes_no_retry(key: str) -> None:
    service = TaskLockService(MemoryBackend())
    with pytest.raises(ValueError, match="on_locked='retry' is for tasks"):
        service.run_exclusive(key, lambda: None, on_locked="retry")  # type: ignore[arg-type]


def test_the_backoff_doubles_up_to_its_most_and_bounds_all_retries() -> None:
    backoff = RetryBackoff(first=1.0, most=10.0, tries=6)
    for attempt, whole in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0)]:
        assert whole / 2 <= backoff.countdown(attempt) <= whole
    assert backoff.bound() == 1 + 2 + 4 + 8 + 10
