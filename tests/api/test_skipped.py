"""Skipped work is visible: one INFO line naming the key and its holder, and ``lock_skipped``."""

from __future__ import annotations

import asyncio
import inspect
import logging
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from django_tasklock import TaskLockService, exclusive
from django_tasklock.backends.base import HeldLock
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.leases.lease import new_token
from django_tasklock.testing import ContractBackend

LONG, LIFE = timedelta(seconds=30), timedelta(hours=1)


class CountingPeeks(MemoryBackend):
    def __init__(self) -> None:
        super().__init__()
        self.peeks = 0

    def peek(self, key: str) -> HeldLock | None:
        self.peeks += 1
        return super().peek(key)


def _work() -> str:  # pragma: no cover - never runs: the key is held
    return "ran"


async def _async_work() -> str:  # pragma: no cover - never runs: the key is held
    return "ran"


def _held_by_someone(backend: Any, key: str) -> tuple[str, HeldLock]:
    token = new_token()
    assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
    held = backend.peek(key)
    assert held is not None
    return token, held


def _check_reported(
    caplog: pytest.LogCaptureFixture,
    skipped: list[dict[str, Any]],
    key: str,
    token: str,
    held: HeldLock,
    what: str,
) -> None:
    lines = [r for r in caplog.records if r.name == "django_tasklock" and "Skipped" in r.message]
    assert len(lines) == 1, [r.message for r in caplog.records]
    line = lines[0]
    assert line.levelno == logging.INFO
    assert len(skipped) == 1
    sent = skipped[0]
    for fact in (
        what,
        repr(key),
        held.holder.host,
        f"pid {held.holder.pid}",
        sent["acquired_at"].isoformat(),
        sent["expires_at"].isoformat(),
    ):
        assert fact in line.message, (fact, line.message)
    assert token.rsplit(":", 1)[1] not in line.message  # never the token's secret
    assert (sent["key"], sent["holder"]) == (key, held.holder)
    # The same lease, read again (the memory backend dates it anew at each read).
    assert abs(sent["acquired_at"] - held.acquired_at) < timedelta(milliseconds=50)
    assert abs(sent["expires_at"] - held.expires_at) < timedelta(milliseconds=50)
    assert token not in repr(sent)


def test_run_exclusive_on_a_held_key_says_who_holds_it(
    any_backend: ContractBackend,
    key: str,
    caplog: pytest.LogCaptureFixture,
    skipped: list[dict[str, Any]],
) -> None:
    backend = any_backend.backend
    token, held = _held_by_someone(backend, key)
    caplog.set_level(logging.INFO, logger="django_tasklock")
    result = TaskLockService(backend).run_exclusive(key, _work)
    assert not result.acquired
    _check_reported(caplog, skipped, key, token, held, "tests.api.test_skipped._work")


def test_exclusive_on_a_held_key_says_who_holds_it_sync_and_async(
    any_backend: ContractBackend,
    key: str,
    caplog: pytest.LogCaptureFixture,
    skipped: list[dict[str, Any]],
) -> None:
    backend = any_backend.backend
    service = TaskLockService(backend)
    token, held = _held_by_someone(backend, key)
    caplog.set_level(logging.INFO, logger="django_tasklock")

    @exclusive(key, service=service)
    def task() -> str:  # pragma: no cover - never runs: the key is held
        return "ran"

    assert task() is None
    _check_reported(caplog, skipped, key, token, held, "task")
    caplog.clear()
    skipped.clear()

    @exclusive(key, service=service)
    async def async_task() -> str:  # pragma: no cover - never runs: the key is held
        return "ran"

    async def main() -> Any:
        try:
            return await async_task()
        finally:
            await sync_to_async(backend.close)()

    assert asyncio.run(main()) is None
    _check_reported(caplog, skipped, key, token, held, "async_task")


def test_arun_exclusive_on_a_held_key_says_who_holds_it(
    any_backend: ContractBackend,
    key: str,
    caplog: pytest.LogCaptureFixture,
    skipped: list[dict[str, Any]],
) -> None:
    backend = any_backend.backend
    token, held = _held_by_someone(backend, key)
    caplog.set_level(logging.INFO, logger="django_tasklock")

    async def main() -> Any:
        try:
            return await TaskLockService(backend).arun_exclusive(key, _async_work, wait=0.3)
        finally:
            await sync_to_async(backend.close)()

    assert not asyncio.run(main()).acquired
    _check_reported(caplog, skipped, key, token, held, "tests.api.test_skipped._async_work")


def test_one_peek_at_most_and_only_when_not_acquired(skipped: list[dict[str, Any]]) -> None:
    backend = CountingPeeks()
    service = TaskLockService(backend)
    assert service.run_exclusive("free", lambda: None).acquired
    assert backend.peeks == 0  # the acquire path reads nothing
    assert skipped == []
    _held_by_someone(backend, "busy")
    backend.peeks = 0
    assert not service.run_exclusive("busy", _work).acquired
    assert backend.peeks == 1  # an INSERT that failed says nothing of the holder: one look
    by_report: list[bool] = []
    original = backend.peek

    def peek(key: str) -> HeldLock | None:
        by_report.append(any(f.function == "report_skipped" for f in inspect.stack()))
        return original(key)

    backend.peek = peek  # type: ignore[method-assign]
    assert not service.run_exclusive("busy", _work, wait=0.2).acquired
    # A waiter looks by peek; the holder its last look saw is the one reported.
    assert len(by_report) >= 1
    assert not any(by_report)
    assert skipped[-1]["holder"] is not None
    assert len(skipped) == 2


def test_a_holder_gone_before_the_look_is_reported_as_such(
    caplog: pytest.LogCaptureFixture, skipped: list[dict[str, Any]]
) -> None:
    class GoneAtOnce(MemoryBackend):
        def acquire(
            self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta
        ) -> bool:
            return False  # held at the INSERT, free by the time we look

    caplog.set_level(logging.INFO, logger="django_tasklock")
    assert not TaskLockService(GoneAtOnce()).run_exclusive("gone", _work).acquired
    assert skipped == [
        {
            "key": "gone",
            "holder": None,
            "acquired_at": None,
            "expires_at": None,
            "outcome": "skipped",
        }
    ]
    assert "let go" in caplog.text


def test_a_failing_look_still_reports_and_never_raises(
    caplog: pytest.LogCaptureFixture, skipped: list[dict[str, Any]]
) -> None:
    class BrokenPeek(MemoryBackend):
        def peek(self, key: str) -> HeldLock | None:
            raise ConnectionError("storage went away")

    backend = BrokenPeek()
    _held_by_someone(MemoryBackend(), "x")  # unrelated: the backend is another
    assert backend.acquire("broken", new_token(), ttl=LONG, max_lifetime=LIFE)
    caplog.set_level(logging.INFO, logger="django_tasklock")
    assert not TaskLockService(backend).run_exclusive("broken", _work).acquired
    assert skipped[0]["holder"] is None
    assert "Skipped" in caplog.text


def test_with_lock_says_nothing_it_raises(skipped: list[dict[str, Any]]) -> None:
    backend = MemoryBackend()
    _held_by_someone(backend, "raised")
    service = TaskLockService(backend)
    with pytest.raises(Exception, match="not acquired"), service.lock("raised"):
        pass  # pragma: no cover
    assert skipped == []
