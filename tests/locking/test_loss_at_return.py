"""An async body that returns, with no ``await`` after the loss, still gives the caller LockLost.

``cancel_on_loss=True`` (and ``@exclusive(on_lost="raise")`` on an ``async
def``) cancels the body at its next ``await``. A body that blocks the event
loop past the declaration (CPU-bound work, a blocking call) and then returns
reaches no such ``await``: its result was made partly without the lock, so
the caller must get ``LockLost``, as the sync ``@exclusive`` gives at return.
The loss is caused for real: the key force-released on every backend, or a
refresh kept waiting past the ttl (a row lock on the databases, ``CLIENT
PAUSE`` on a private Redis).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async

from django_tasklock import LockLost, TaskLockService, current_lock, exclusive
from django_tasklock.backends.base import BaseBackend
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.reasons import EXPIRED, RELEASED_BY_OPERATOR
from django_tasklock.testing import ContractBackend
from tests.conftest import DATABASE_ALIASES, require_service
from tests.leases.test_stalled_refresh import BLOCKED, TTL, _block_row
from tests.locking.test_loss import PATIENCE, lose, run
from tests.support.servers import private_redis

Body = Callable[[], Coroutine[Any, Any, str]]
Enter = Callable[[TaskLockService, str, Body], Coroutine[Any, Any, str]]


async def _async_with(service: TaskLockService, key: str, body: Body) -> str:
    async with service.lock(key, cancel_on_loss=True, ttl=30, refresh_interval=0.1):
        result: str = await body()
        return result


async def _arun_exclusive(service: TaskLockService, key: str, body: Body) -> str:
    outcome = await service.arun_exclusive(
        key, body, cancel_on_loss=True, ttl=30, refresh_interval=0.1
    )
    return str(outcome.result)


async def _exclusive(service: TaskLockService, key: str, body: Body) -> str:
    work = exclusive(key, on_lost="raise", service=service, ttl=30, refresh_interval=0.1)(body)
    return str(await work())


def _blocked_until_lost() -> str:
    """The rest of the body: the loop blocked until the loss is declared, then a return."""
    held = current_lock()
    assert held is not None
    assert held.wait_lost(PATIENCE)  # blocks the event loop: no await from here on
    return "made partly without the lock"


@pytest.mark.parametrize(
    "enter", [_async_with, _arun_exclusive, _exclusive], ids=["async_with", "arun", "exclusive"]
)
def test_a_body_returning_without_an_await_after_the_loss_raises_lock_lost(
    any_backend: ContractBackend, key: str, enter: Enter
) -> None:
    backend = any_backend.backend

    async def body() -> str:
        await sync_to_async(lose, thread_sensitive=True)(backend, key)
        return _blocked_until_lost()

    async def main() -> LockLost:
        with pytest.raises(LockLost) as caught:
            await enter(TaskLockService(backend), key, body)
        return caught.value

    error = run(backend, main())
    assert (error.key, error.reason) == (key, RELEASED_BY_OPERATOR)
    assert backend.peek(key) is None


@pytest.fixture(params=["default", "postgres", "mariadb", "redis"])
def stalling(request: pytest.FixtureRequest) -> Iterator[tuple[BaseBackend, Callable[[str], Any]]]:
    """A backend and ``stall(key)``: its refreshes of ``key`` wait past the ttl, for real."""
    name = str(request.param)
    if name == "redis":
        require_service("redis")
        with private_redis() as server:
            admin = redis.Redis.from_url(server.url)

            def pause(key: str) -> None:
                admin.client_pause(int(BLOCKED * 1000), all=True)

            try:
                yield RedisBackend(url=server.url), pause
            finally:
                admin.client_unpause()
        return
    if name not in DATABASE_ALIASES:
        require_service(name)
    started = threading.Event()
    blockers: list[threading.Thread] = []

    def block(key: str) -> None:
        blocker = threading.Thread(
            target=_block_row, args=(name, f"task-lock:{key}", BLOCKED, started)
        )
        blocker.start()
        blockers.append(blocker)
        assert started.wait(5)

    yield DatabaseBackend(using=name), block
    for blocker in blockers:
        blocker.join()


@pytest.mark.databases
def test_a_cpu_bound_body_past_a_stalled_refresh_deadline_raises_lock_lost(
    stalling: tuple[BaseBackend, Callable[[str], Any]], key: str
) -> None:
    backend, stall = stalling

    @exclusive(
        key, on_lost="raise", service=TaskLockService(backend), ttl=TTL, refresh_interval=0.25
    )
    async def work() -> str:
        await asyncio.sleep(0.4)  # a refresh or two confirmed
        held = current_lock()
        assert held is not None
        assert not held.lost
        await sync_to_async(stall, thread_sensitive=True)(key)
        time.sleep(0.05)  # the heartbeat's next refresh waits from here on
        return _blocked_until_lost()  # declared by the deadline while the loop is blocked

    async def main() -> LockLost:
        with pytest.raises(LockLost) as caught:
            await work()
        return caught.value

    error = run(backend, main())
    assert (error.key, error.reason) == (key, EXPIRED)
