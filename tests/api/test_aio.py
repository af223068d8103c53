"""asyncio: arun_exclusive and async with never block the loop; cancelling releases."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from django_tasklock import TaskLockService
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.leases.lease import new_token
from django_tasklock.testing import ContractBackend
from tests.conftest import database_backend, redis_backend, require_service

LONG, LIFE = timedelta(seconds=30), timedelta(hours=1)


@pytest.fixture(params=["postgres", "redis"])
def networked(request: pytest.FixtureRequest, key: str) -> Iterator[ContractBackend]:
    require_service(request.param)
    if request.param == "postgres":
        yield database_backend("postgres")
    else:
        yield from redis_backend(key)


async def _nothing() -> str:
    return "done"


def test_arun_exclusive_runs_the_coroutine_and_releases() -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)
    result = asyncio.run(service.arun_exclusive("a", _nothing, fencing=True))
    assert (result.acquired, result.result, result.lost, result.fence) == (True, "done", False, 1)
    assert backend.list() == []


def test_arun_exclusive_on_a_held_key_calls_on_locked_plain_or_async() -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)
    assert backend.acquire("held", new_token(), ttl=LONG, max_lifetime=LIFE)
    called: list[str] = []

    async def async_on_locked() -> None:
        called.append("async")

    async def main() -> None:
        first = await service.arun_exclusive("held", _nothing, on_locked=async_on_locked)
        second = await service.arun_exclusive(
            "held", _nothing, on_locked=lambda: called.append("plain"), wait=0.1
        )
        assert not first.acquired
        assert not second.acquired

    asyncio.run(main())
    assert called == ["async", "plain"]


def test_arun_exclusive_wants_something_to_await() -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)
    with pytest.raises(TypeError, match=r"async_fn returned NoneType.*use run_exclusive\(\)"):
        asyncio.run(service.arun_exclusive("k", lambda: None))  # type: ignore[arg-type,return-value]
    assert backend.list() == []  # released


def test_arun_exclusive_takes_a_callable_returning_a_coroutine() -> None:
    """What users naturally pass: a lambda or a partial around an async def."""
    service = TaskLockService(MemoryBackend())

    async def twice(n: int) -> int:
        await asyncio.sleep(0)
        return 2 * n

    async def main() -> tuple[int | None, int | None]:
        by_lambda = await service.arun_exclusive("k", lambda: twice(2))
        by_partial = await service.arun_exclusive("k", functools.partial(twice, 3))
        return by_lambda.result, by_partial.result

    assert asyncio.run(main()) == (4, 6)


def test_the_sync_apis_advice_for_a_coroutine_is_the_way_out() -> None:
    """run_exclusive(lambda: afn()) named arun_exclusive(), which then named
    run_exclusive(): a circle. The async API takes that very lambda."""
    service = TaskLockService(MemoryBackend())

    async def work() -> str:
        return "done"

    with pytest.raises(TypeError, match=r"use arun_exclusive\(\), which awaits"):
        service.run_exclusive("k", lambda: work())
    assert asyncio.run(service.arun_exclusive("k", lambda: work())).result == "done"


def test_cancelling_the_task_releases_the_lock_and_propagates() -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)

    async def main() -> None:
        started = asyncio.Event()

        async def work() -> None:
            started.set()
            await asyncio.sleep(30)

        task = asyncio.create_task(service.arun_exclusive("cancelled", work, ttl=30))
        await started.wait()
        assert backend.peek("cancelled") is not None
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert backend.list() == []


def test_cancelling_a_waiter_mid_attempt_releases_what_the_attempt_took() -> None:
    class SlowToAcquire(MemoryBackend):
        def __init__(self) -> None:
            super().__init__()
            self.entered, self.proceed = threading.Event(), threading.Event()

        def acquire(
            self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta
        ) -> bool:
            self.entered.set()
            self.proceed.wait(10)
            return super().acquire(key, token, ttl=ttl, max_lifetime=max_lifetime)

    backend = SlowToAcquire()
    lock = TaskLockService(backend).lock("abandoned", ttl=30)

    async def main() -> None:
        task = asyncio.create_task(lock.aacquire())
        await asyncio.to_thread(backend.entered.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        backend.proceed.set()  # the attempt now takes the key in its thread...
        for _ in range(200):  # ...and is released as soon as it has
            await asyncio.sleep(0.01)
            if backend.list() == [] and not lock.held:
                break

    asyncio.run(main())
    assert backend.list() == []
    assert not lock.held


@pytest.mark.databases
def test_the_loop_is_never_blocked(networked: ContractBackend, key: str) -> None:
    backend = networked.backend
    service = TaskLockService(backend)

    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        late: list[float] = []

        async def ticker() -> None:
            while not stop.is_set():
                before = loop.time()
                await asyncio.sleep(0.01)
                late.append(loop.time() - before - 0.01)

        ticking = asyncio.create_task(ticker())
        try:
            async with service.lock(key, ttl=0.6, refresh_interval=0.2) as held:
                waiter = asyncio.create_task(service.arun_exclusive(key, _nothing, wait=5))
                await asyncio.sleep(1.0)  # refreshed meanwhile; the waiter polls
                assert not held.lost
            result = await waiter
            assert result.acquired
        finally:
            stop.set()
            await ticking
            await sync_to_async(backend.close)()
        return sorted(late)

    started = time.monotonic()
    late = asyncio.run(main())
    assert time.monotonic() - started >= 1.0
    # Anything run on the loop (a time.sleep between polls, a storage call)
    # would make ticks late by its length. One tick may be late because the
    # machine's CPUs are busy elsewhere, never by much.
    assert late[-2] < 0.05, late[-5:]
    assert late[-1] < 0.2, late[-5:]


def test_the_sync_api_inside_async_code_is_refused_alike_on_every_backend(
    any_backend: ContractBackend, key: str
) -> None:
    # Without the guard: Django's generic SynchronousOnlyOperation on the
    # database backend, and a lock that blocks the event loop on Redis.
    from django.core.exceptions import SynchronousOnlyOperation

    from django_tasklock.exceptions import SyncLockInAsyncContext, TaskLockError

    service = TaskLockService(any_backend.backend)
    ran: list[str] = []
    errors: list[BaseException] = []

    async def main() -> None:
        for attempt in (
            lambda: service.lock(key).__enter__(),
            lambda: service.lock(key).acquire(),
            lambda: service.run_exclusive(key, lambda: ran.append("fn")),
        ):
            with pytest.raises(SyncLockInAsyncContext) as info:
                attempt()
            errors.append(info.value)

    asyncio.run(main())
    assert ran == []
    for error in errors:
        assert isinstance(error, TaskLockError)
        assert isinstance(error, SynchronousOnlyOperation)  # what Django users already catch
        assert key in str(error)
    assert "async with" in str(errors[0])
    assert "arun_exclusive" in str(errors[2])
    # Nothing was written: the key is free, and the sync API works outside the loop.
    assert any_backend.backend.peek(key) is None
    assert service.run_exclusive(key, lambda: "ran").result == "ran"


def test_the_sync_api_in_a_worker_thread_of_async_code_works(any_backend: ContractBackend) -> None:
    # What Django does with a sync view under ASGI: no event loop in that thread.
    service = TaskLockService(any_backend.backend)

    async def main() -> str | None:
        try:
            result = await sync_to_async(service.run_exclusive)("in-a-thread", lambda: "ran")
        finally:
            await sync_to_async(connections.close_all, thread_sensitive=True)()
        return result.result

    assert asyncio.run(main()) == "ran"
