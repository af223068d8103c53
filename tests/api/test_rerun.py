"""``on_locked="rerun"``: calls skipped while the key is held make one more run, after it.

On every storage (memory, SQLite, PostgreSQL, MariaDB, Redis), through
``run_exclusive``, ``arun_exclusive`` and ``@exclusive``. The holder runs in a
thread of its own, stopped in its work until the test lets it go, so that
the skipped calls come while it holds the key, every time.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from django_tasklock import TaskLockService, exclusive
from django_tasklock.backends.base import BaseBackend
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.testing import ContractBackend

PATIENCE = 120  # a generous bound for a condition, never a pause


class Rebuild:
    """Work that records what it saw of ``changes``; its first run waits for ``go``."""

    def __init__(self) -> None:
        self.changes = 0
        self.seen: list[int] = []
        self.started, self.go = threading.Event(), threading.Event()

    def __call__(self) -> int:
        self.seen.append(self.changes)  # what the run starts from
        if len(self.seen) == 1:
            self.started.set()
            assert self.go.wait(PATIENCE), "the test never let the first run go"
        return self.changes


def hold_in_thread(target: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(target())
        finally:
            connections.close_all()  # this thread's

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_twenty_skipped_calls_make_one_more_run_that_sees_them_all(
    any_backend: ContractBackend, key: str, skipped: list[dict[str, Any]]
) -> None:
    service = TaskLockService(any_backend.backend)
    work = Rebuild()
    holder, out = hold_in_thread(lambda: service.run_exclusive(key, work, on_locked="rerun"))
    try:
        assert work.started.wait(PATIENCE)
        for _ in range(20):
            work.changes += 1  # the change each trigger announces, made before it
            result = service.run_exclusive(key, work, on_locked="rerun")
            assert not result.acquired
            assert result.rerun
    finally:
        work.go.set()
        holder.join(PATIENCE)
    assert work.seen == [0, 20], "one run more, after the first, seeing every change"
    (first,) = out
    assert first.acquired
    assert first.result == 20  # the last run's result
    assert not first.rerun
    assert [s["outcome"] for s in skipped] == ["rerun"] * 20
    assert any_backend.backend.rerun_marks(key) == {}
    assert any_backend.backend.peek(key) is None


def test_a_call_that_finds_the_key_free_runs_itself(
    any_backend: ContractBackend, key: str
) -> None:
    service = TaskLockService(any_backend.backend)
    result = service.run_exclusive(key, lambda: "ran", on_locked="rerun")
    assert result.acquired
    assert result.result == "ran"
    assert not result.rerun
    assert any_backend.backend.rerun_marks(key) == {}


def test_a_holder_that_raises_leaves_the_mark_to_the_next_holder(
    any_backend: ContractBackend, key: str
) -> None:
    service, runs = TaskLockService(any_backend.backend), []
    started, go = threading.Event(), threading.Event()

    def failing() -> None:
        started.set()
        assert go.wait(PATIENCE)
        raise RuntimeError("the work failed")

    errors: list[BaseException] = []

    def hold() -> None:
        try:
            service.run_exclusive(key, failing, on_locked="rerun")
        except RuntimeError as exc:
            errors.append(exc)
        finally:
            connections.close_all()  # this thread's

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert started.wait(PATIENCE)
        assert service.run_exclusive(key, lambda: runs.append(1), on_locked="rerun").rerun
    finally:
        go.set()
        holder.join(PATIENCE)
    assert len(errors) == 1
    assert runs == []
    assert list(any_backend.backend.rerun_marks(key)) == [key]
    # The next holder owes the run: its own, then once more.
    result = service.run_exclusive(key, lambda: runs.append(1), on_locked="rerun")
    assert result.acquired
    assert runs == [1, 1]
    assert any_backend.backend.rerun_marks(key) == {}


def test_the_decorator_runs_the_holder_once_more_with_its_own_arguments(
    any_backend: ContractBackend, key: str
) -> None:
    calls: list[tuple[str, int]] = []
    started, go = threading.Event(), threading.Event()

    @exclusive(key, on_locked="rerun", service=TaskLockService(any_backend.backend))
    def rebuild(who: str, n: int) -> str:
        calls.append((who, n))
        if len(calls) == 1:
            started.set()
            assert go.wait(PATIENCE)
        return who

    holder, out = hold_in_thread(lambda: rebuild("holder", 1))
    try:
        assert started.wait(PATIENCE)
        assert rebuild("skipped", 2) is None
        assert rebuild("skipped", 3) is None
    finally:
        go.set()
        holder.join(PATIENCE)
    assert calls == [("holder", 1), ("holder", 1)]
    assert out == ["holder"]


async def _until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def test_asyncio_twins_rerun_too(any_backend: ContractBackend, key: str) -> None:
    service = TaskLockService(any_backend.backend)
    runs: list[int] = []

    @exclusive(key + "-decorated", on_locked="rerun", service=service)
    async def decorated(n: int) -> int:
        runs.append(n)
        if len(runs) == 1:
            await asyncio.sleep(0)
            assert await decorated(2) is None  # skipped while this call holds the key
        return n

    async def main() -> None:
        gate = asyncio.Event()
        seen: list[int] = []

        async def work() -> int:
            seen.append(len(seen))
            if len(seen) == 1:
                await gate.wait()
            return len(seen)

        holder = asyncio.create_task(service.arun_exclusive(key, work, on_locked="rerun"))
        try:
            await asyncio.wait_for(_until(lambda: bool(seen)), PATIENCE)
            skipped = await service.arun_exclusive(key, work, on_locked="rerun")
            assert skipped.rerun
        finally:
            gate.set()  # whatever failed above, the holder is let go
        result = await asyncio.wait_for(holder, PATIENCE)
        assert result.acquired
        assert result.result == 2
        assert seen == [0, 1]
        assert await decorated(1) == 1
        await sync_to_async(any_backend.backend.close)()  # the worker thread's connections

    asyncio.run(main())
    assert runs == [1, 1]


@pytest.mark.parametrize(
    ("options", "error", "named"),
    [
        ({"limit": 2}, ValueError, "limit"),
        ({"min_hold": 5}, ValueError, "min_hold"),
    ],
)
def test_what_rerun_cannot_serve_is_refused_before_anything_is_written(
    options: dict[str, Any], error: type[Exception], named: str, key: str
) -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)
    with pytest.raises(error, match=named):
        service.run_exclusive(key, lambda: None, on_locked="rerun", **options)
    with pytest.raises(error, match=named):
        exclusive(key, on_locked="rerun", service=service, **options)(lambda: None)()
    assert backend.list() == []


def test_another_string_is_refused_naming_on_locked(key: str) -> None:
    service = TaskLockService(MemoryBackend())
    with pytest.raises(ValueError, match="on_locked"):
        service.run_exclusive(key, lambda: None, on_locked="again")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_locked"):
        exclusive(key, on_locked="again")  # type: ignore[call-overload]


class NoMarks(MemoryBackend):
    capabilities = BaseBackend.capabilities


def test_a_backend_that_cannot_mark_is_refused(key: str) -> None:
    backend = NoMarks()
    with pytest.raises(NotImplementedError, match="rerun"):
        TaskLockService(backend).run_exclusive(key, lambda: None, on_locked="rerun")
    assert backend.list() == []
