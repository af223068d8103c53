"""Cancelling ``arun_exclusive`` at any moment around the acquisition: one release, no noise.

A cancellation that lands as the acquisition finishes in its worker thread
finds the key taken both by the caller's ``finally`` and by the clean-up of
the abandoned attempt; only one of them may release it. The other used to
raise ``RuntimeError("... is not held")`` in a background task, reported by
asyncio as "Task exception was never retrieved".

A cancellation that lands while the attempt waits for the storage's answer
gives the attempt up: granted, it deletes its row in its own thread. It used
to leave the release to the event loop once the answer came, and to count
the attempt nowhere: whoever waited for the lock's background work to end
(``aio._background``), or ended the loop meanwhile (``asyncio.run``
returning), left the grant held and refreshed by the heartbeat.
"""

from __future__ import annotations

import asyncio
import gc
import random
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from django_tasklock.api.service import TaskLockService
from django_tasklock.locking import aio
from django_tasklock.locking.lock import Lock
from django_tasklock.signals import lock_acquired
from django_tasklock.testing import ContractBackend
from django_tasklock.testing.delegate import DelegatingBackend
from tests.conftest import database_backend, redis_backend, require_service

pytestmark = pytest.mark.databases

ROUNDS = 300


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def storage(request: pytest.FixtureRequest, key: str) -> Iterator[ContractBackend]:
    if request.param == "sqlite":
        yield database_backend("default")
    elif request.param == "postgres":
        require_service("postgres")
        yield database_backend("postgres")
    else:
        require_service("redis")
        yield from redis_backend(key)


async def _work() -> None:
    await asyncio.sleep(0)


class SlowAnswer(DelegatingBackend):
    """``inner``'s answers; an acquisition's answer, once ``inner`` gave it, held up
    until ``answer`` is set (a slow network on the way back)."""

    def __init__(self, inner: ContractBackend) -> None:
        super().__init__(inner.backend)
        self.asked, self.answer = threading.Event(), threading.Event()

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        granted = self.inner.acquire(key, token, ttl=ttl, max_lifetime=max_lifetime)
        self.asked.set()
        self.answer.wait(10)
        return granted


async def _cancelled_while_the_answer_is_on_its_way(
    service: TaskLockService, backend: SlowAnswer, key: str
) -> None:
    task = asyncio.create_task(service.arun_exclusive(key, _work, ttl=30))
    await asyncio.to_thread(backend.asked.wait, 10)
    assert backend.asked.is_set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_an_attempt_given_up_is_background_work_that_leaves_nothing(
    storage: ContractBackend, key: str
) -> None:
    backend = SlowAnswer(storage)
    service = TaskLockService(backend)

    async def main() -> object:
        await _cancelled_while_the_answer_is_on_its_way(service, backend, key)
        backend.answer.set()
        for _ in range(1000):  # what the lock still has to do after its caller left
            if not aio._background:
                break
            await asyncio.sleep(0.01)
        # On the lock's thread, so behind anything the attempt still runs there.
        found = await sync_to_async(storage.backend.peek)(key)
        await sync_to_async(storage.backend.close)()
        return found

    assert asyncio.run(main()) is None


def test_an_attempt_given_up_leaves_nothing_after_its_loop_ended(
    storage: ContractBackend, key: str
) -> None:
    backend = SlowAnswer(storage)
    service = TaskLockService(backend)
    asyncio.run(_cancelled_while_the_answer_is_on_its_way(service, backend, key))
    assert storage.backend.peek(key) is not None  # granted; the answer is on its way
    backend.answer.set()  # ...and comes after the loop has ended
    deadline = time.monotonic() + 10
    while storage.backend.peek(key) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        assert storage.backend.peek(key) is None
    finally:
        asyncio.run(sync_to_async(storage.backend.close)())  # the lock's thread's connection


async def _cancel_around_acquisitions(service: TaskLockService, key: str) -> dict[str, Any]:
    """Start ``ROUNDS`` runs and cancel each at a moment spread around its acquisition."""
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    started = time.perf_counter()
    for _ in range(5):
        assert (await service.arun_exclusive(key, _work)).acquired
    took = (time.perf_counter() - started) / 5
    ran = cancelled = 0
    for _ in range(ROUNDS):
        task = asyncio.create_task(service.arun_exclusive(key, _work, ttl=30))
        loop.call_later(random.uniform(0, 1.5 * took), task.cancel)
        try:
            ran += (await task).acquired
        except asyncio.CancelledError:
            cancelled += 1
    # The releases of abandoned attempts finish in the background, one at a time
    # on the lock's thread: on a loaded machine 300 of them can take seconds.
    for _ in range(6000):
        if not aio._background:
            break
        await asyncio.sleep(0.01)
    gc.collect()  # a task whose exception nobody retrieved is reported when collected
    await asyncio.sleep(0)
    await sync_to_async(service.backend.close)()  # the worker thread's connection
    return {"unhandled": unhandled, "ran": ran, "cancelled": cancelled}


def test_cancelling_around_the_acquisition_releases_once_and_leaves_nothing(
    storage: ContractBackend, key: str
) -> None:
    service = TaskLockService(storage.backend)
    outcome = asyncio.run(_cancel_around_acquisitions(service, key))
    unhandled = outcome["unhandled"]
    assert unhandled == [], (
        f"{len(unhandled)} unhandled in {outcome['cancelled']} cancellations: {unhandled[0]}"
    )
    assert outcome["cancelled"] > 0
    assert not aio._background, f"{len(aio._background)} releases still running after 60 s"
    assert storage.backend.peek(key) is None


def test_a_cancellation_landing_once_the_grant_is_the_locks_releases_it_once(
    storage: ContractBackend, key: str
) -> None:
    """The other side of the hand-over: the attempt made the grant the lock's
    (its ``lock_acquired`` receivers run in its thread) before the cancellation."""
    granted, go_on = threading.Event(), threading.Event()

    def hold_up(sender: object, **kwargs: Any) -> None:
        if kwargs["key"] == key:
            granted.set()
            go_on.wait(10)

    service = TaskLockService(storage.backend)

    held_when_cancelled: list[bool] = []

    async def caller(lock: Lock) -> None:
        try:
            await lock.atry_acquire()
        except asyncio.CancelledError:
            # In the step that gave the attempt up: no release can have begun yet.
            held_when_cancelled.append(lock.held)
            raise

    async def main() -> tuple[object, list[dict[str, Any]]]:
        unhandled: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: unhandled.append(context))
        task = asyncio.create_task(caller(service.lock(key, ttl=30)))
        await asyncio.to_thread(granted.wait, 10)
        assert granted.is_set()
        task.cancel()
        go_on.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(1000):
            if not aio._background:
                break
            await asyncio.sleep(0.01)
        found = await sync_to_async(storage.backend.peek)(key)
        await sync_to_async(storage.backend.close)()
        gc.collect()
        return found, unhandled

    lock_acquired.connect(hold_up, weak=False)
    try:
        found, unhandled = asyncio.run(main())
    finally:
        lock_acquired.disconnect(hold_up)
    assert held_when_cancelled == [True]  # made the lock's first: released by the lock
    assert found is None
    assert unhandled == []
