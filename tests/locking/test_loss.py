"""Acting on a lost lease: raise_if_lost, lost_event, cancel_on_loss, on_lost, current_lock.

A loss is caused for real on every backend: the key is force-released out of
band, and the heartbeat's next refresh (every 0.1 s here) finds it gone.
"""

from __future__ import annotations

import asyncio
import pickle
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
from asgiref.sync import sync_to_async

from django_tasklock import (
    LockLost,
    TaskLockError,
    TaskLockService,
    checkpoint,
    current_lock,
    exclusive,
    run_exclusive,
)
from django_tasklock.backends.base import BaseBackend
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.leases.lease import clock
from django_tasklock.locking.lock import Lock
from django_tasklock.testing import ContractBackend

T = TypeVar("T")
#: The lease outlives the test (ttl=30); the heartbeat looks every 0.1 s (refresh_interval).

#: Long enough for the heartbeat to find a force release on a loaded machine.
PATIENCE = 10.0


class CountingBackend(MemoryBackend):
    """Counts every call the lock makes to its backend."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if name in {"acquire", "refresh", "refresh_many", "release", "peek", "fence"}:
            object.__setattr__(self, "calls", object.__getattribute__(self, "calls") + 1)
        return value


def lose(backend: BaseBackend, key: str) -> None:
    """Take the lease away as an operator would (``manage.py tasklock release``)."""
    assert backend.force_release(key)


def run(backend: BaseBackend, main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, then close what the lock's worker thread opened there."""

    async def closing() -> T:
        try:
            return await main
        finally:
            await sync_to_async(backend.close, thread_sensitive=True)()

    return asyncio.run(closing())


# -- 7. sync code: raise_if_lost(), lost_event, wait_lost() ----------------------------


def test_lock_lost_is_a_task_lock_error_with_key_and_reason_and_pickles() -> None:
    error = LockLost("rollups", "taken")
    assert isinstance(error, TaskLockError)
    assert (error.key, error.reason) == ("rollups", "taken")
    assert "'rollups'" in str(error)
    assert "taken" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.key, copy.reason, str(copy)) == ("rollups", "taken", str(error))
    assert LockLost("rollups").reason is None
    assert "None" not in str(LockLost("rollups"))


def test_raise_if_lost_and_wait_lost_follow_the_declaration(
    any_backend: ContractBackend, key: str
) -> None:
    backend = any_backend.backend
    held = TaskLockService(backend).lock(key, ttl=30, refresh_interval=0.1)
    with pytest.raises(RuntimeError, match="never acquired"):
        held.wait_lost(0)
    held.raise_if_lost()  # not acquired yet: nothing to lose
    with held:
        held.raise_if_lost()
        assert not held.wait_lost(0.05)
        assert not held.lost_event.is_set()
        lose(backend, key)
        assert held.wait_lost(PATIENCE)
        assert held.lost
        with pytest.raises(LockLost) as caught:
            held.raise_if_lost()
        assert caught.value.key == key
        assert caught.value.reason == held._lease.reason  # type: ignore[union-attr]
    with pytest.raises(LockLost):  # still says so after the release
        held.raise_if_lost()


def test_raise_if_lost_makes_no_storage_call() -> None:
    backend = CountingBackend()
    with TaskLockService(backend).lock("tight-loop", ttl=30) as held:
        before = backend.calls
        for _ in range(100_000):
            held.raise_if_lost()
            held.progress()
        assert backend.calls == before


def test_a_new_acquisition_has_a_new_lost_event() -> None:
    backend = MemoryBackend()
    held = TaskLockService(backend).lock("again", ttl=30, refresh_interval=0.1)
    with held:
        first = held.lost_event
        lose(backend, "again")
        assert held.wait_lost(PATIENCE)
    with held:
        assert held.lost_event is not first
        assert not held.lost
        held.raise_if_lost()


# -- 8. asyncio: cancel_on_loss ---------------------------------------------------------


def _cancelled_by_the_loss(
    backend: BaseBackend, key: str, enter: Callable[[Any], Any]
) -> tuple[LockLost, float]:
    """Run a body under ``enter(body)`` that waits forever; lose its lease.

    Returns the ``LockLost`` the caller saw and the seconds from the
    declaration of the loss to the body's ``CancelledError``.
    """
    declared: list[float] = []
    cancelled: list[float] = []

    async def body() -> None:
        held = current_lock()
        assert held is not None
        assert held.cancel_on_loss
        lease = held._lease
        assert lease is not None
        declare = lease.mark_lost

        def timed(reason: str | None = None) -> bool:  # the instant of the declaration
            declared.append(clock())
            return declare(reason)

        lease.mark_lost = timed  # type: ignore[method-assign]
        await sync_to_async(lose, thread_sensitive=True)(backend, key)
        try:
            await asyncio.sleep(PATIENCE * 3)
        except asyncio.CancelledError:
            cancelled.append(clock())
            raise

    async def main() -> LockLost:
        with pytest.raises(LockLost) as caught:
            await enter(body)
        task = asyncio.current_task()
        assert task is not None
        if sys.version_info >= (3, 11):
            assert task.cancelling() == 0
        return caught.value

    error = run(backend, main())
    assert declared
    assert len(cancelled) == 1
    return error, cancelled[0] - declared[0]


def test_async_with_cancel_on_loss_cancels_the_body_and_raises_lock_lost(
    any_backend: ContractBackend, key: str
) -> None:
    backend = any_backend.backend
    held = TaskLockService(backend).lock(key, cancel_on_loss=True, ttl=30, refresh_interval=0.1)

    async def enter(body: Callable[[], Any]) -> None:
        async with held:
            await body()

    error, delay = _cancelled_by_the_loss(backend, key, enter)
    assert error.key == key
    assert isinstance(error.__cause__, asyncio.CancelledError)
    assert not held.held
    assert backend.peek(key) is None
    print(f"{any_backend.name}: body cancelled {delay * 1000:.1f} ms after the declaration")
    # The bound is 100 ms; the slack is for a loaded machine, not for a design that waits.
    assert delay < 0.5


def test_arun_exclusive_cancel_on_loss_raises_lock_lost(
    any_backend: ContractBackend, key: str
) -> None:
    backend = any_backend.backend
    service = TaskLockService(backend)

    async def enter(body: Callable[[], Any]) -> None:
        await service.arun_exclusive(key, body, cancel_on_loss=True, ttl=30, refresh_interval=0.1)

    error, delay = _cancelled_by_the_loss(backend, key, enter)
    assert error.key == key
    print(f"{any_backend.name}: body cancelled {delay * 1000:.1f} ms after the declaration")
    assert delay < 0.5


def test_a_cancellation_from_outside_still_propagates_as_cancelled_error() -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)

    async def main() -> None:
        started = asyncio.Event()

        async def body() -> None:
            started.set()
            await asyncio.sleep(30)

        task = asyncio.create_task(service.arun_exclusive("outside", body, cancel_on_loss=True))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert backend.list() == []


def test_an_outside_cancellation_during_our_own_wins() -> None:
    backend = MemoryBackend()
    held = TaskLockService(backend).lock("both", cancel_on_loss=True, ttl=30, refresh_interval=0.1)

    async def main() -> None:
        cleaning = asyncio.Event()

        async def body() -> None:
            async with held:
                lose(backend, "both")
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:  # ours: clean up, slowly
                    cleaning.set()
                    await asyncio.sleep(30)  # where the outside one lands

        task = asyncio.create_task(body())
        await asyncio.wait_for(cleaning.wait(), PATIENCE)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert not held.held


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is Python 3.11+")
def test_a_loss_under_asyncio_timeout_is_lock_lost_not_timeout() -> None:
    backend = MemoryBackend()
    held = TaskLockService(backend).lock(
        "timeout", cancel_on_loss=True, ttl=30, refresh_interval=0.1
    )

    async def body() -> None:
        async with asyncio.timeout(PATIENCE * 3), held:
            lose(backend, "timeout")
            await asyncio.sleep(PATIENCE * 6)

    async def main() -> None:
        with pytest.raises(LockLost):
            await body()
        await asyncio.sleep(0.01)  # the task is not left cancelled

    asyncio.run(main())


def test_a_body_that_ends_before_the_loss_is_not_cancelled_later() -> None:
    backend = MemoryBackend()
    held = TaskLockService(backend).lock(
        "ended", cancel_on_loss=True, ttl=30, refresh_interval=0.1
    )

    async def main() -> None:
        async with held:
            pass
        lease = held._lease
        assert lease is not None
        lease.mark_lost("taken")  # a loss declared after the release
        await asyncio.sleep(0.05)  # the task goes on: nothing cancels it

    asyncio.run(main())


@pytest.mark.parametrize(
    "call",
    [
        lambda lock: lock.__enter__(),
        lambda lock: lock.acquire(),
        lambda lock: lock.try_acquire(),
        lambda lock: asyncio.run(lock.aacquire()),
        lambda lock: asyncio.run(lock.atry_acquire()),
    ],
    ids=["with", "acquire", "try_acquire", "aacquire", "atry_acquire"],
)
def test_cancel_on_loss_is_refused_where_it_cannot_apply(call: Callable[[Lock], Any]) -> None:
    backend = MemoryBackend()
    held = TaskLockService(backend).lock("sync", cancel_on_loss=True)
    with pytest.raises(TypeError, match="cancel_on_loss"):
        call(held)
    assert backend.list() == []


def test_cancel_on_loss_is_refused_by_the_sync_apis_and_must_be_a_bool() -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)
    with pytest.raises(TypeError, match="cancel_on_loss"):
        service.run_exclusive("sync", lambda: None, cancel_on_loss=True)
    with pytest.raises(TypeError, match="cancel_on_loss"):
        service.lock("sync", cancel_on_loss="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="on_lost='raise'"):
        exclusive("sync", cancel_on_loss=True)
    assert backend.list() == []
    assert service.run_exclusive("sync", lambda: 1, cancel_on_loss=False).result == 1


# -- 9. @exclusive(on_lost=...), current_lock(), checkpoint() -----------------------------


def test_current_lock_is_the_innermost_lock_held() -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)
    assert current_lock() is None
    checkpoint()  # no lock: nothing to do
    with service.lock("outer") as outer:
        assert current_lock() is outer
        with service.lock("inner") as inner:
            assert current_lock() is inner
        assert current_lock() is outer
        seen = service.run_exclusive("fn", current_lock).result
        assert seen is not None
        assert seen.key == "fn"
        assert current_lock() is outer
    assert current_lock() is None

    @exclusive("decorated", service=service)
    def decorated() -> Lock | None:
        return current_lock()

    got = decorated()
    assert got is not None
    assert got.key == "decorated"

    async def main() -> None:
        async with service.lock("async") as held:
            assert current_lock() is held
            assert await sync_to_async(current_lock)() is held  # follows into the thread
        assert current_lock() is None

    asyncio.run(main())


def test_on_lost_is_checked_at_decoration() -> None:
    with pytest.raises(ValueError, match="on_lost"):
        exclusive("k", on_lost="stop")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="on_lost"):
        exclusive("k", on_lost=True)  # type: ignore[call-overload]


def test_by_default_decorated_work_keeps_going_and_sees_lost(
    any_backend: ContractBackend, key: str
) -> None:
    backend = any_backend.backend

    @exclusive(key, service=TaskLockService(backend), ttl=30, refresh_interval=0.1)
    def work() -> str:
        held = current_lock()
        assert held is not None
        lose(backend, key)
        assert held.wait_lost(PATIENCE)
        checkpoint()  # on_lost="continue": does not stop the work
        assert held.lost
        return "finished"

    assert work() == "finished"


def test_on_lost_raise_stops_sync_work_at_its_next_checkpoint(
    any_backend: ContractBackend, key: str
) -> None:
    backend = any_backend.backend
    after: list[str] = []

    @exclusive(
        key, on_lost="raise", service=TaskLockService(backend), ttl=30, refresh_interval=0.1
    )
    def work() -> None:
        held = current_lock()
        assert held is not None
        checkpoint()  # not lost yet
        lose(backend, key)
        held.wait_lost(PATIENCE)
        checkpoint()
        after.append("went on")  # pragma: no cover - must not run

    with pytest.raises(LockLost) as caught:
        work()
    assert caught.value.key == key
    assert after == []
    assert backend.peek(key) is None


def test_on_lost_raise_without_checkpoint_raises_when_the_function_returns() -> None:
    backend = MemoryBackend()

    @exclusive(
        "no-checkpoint",
        on_lost="raise",
        service=TaskLockService(backend),
        ttl=30,
        refresh_interval=0.1,
    )
    def work() -> str:
        lose(backend, "no-checkpoint")
        held = current_lock()
        assert held is not None
        assert held.wait_lost(PATIENCE)
        return "suspect"

    with pytest.raises(LockLost):
        work()

    @exclusive(
        "kept", on_lost="raise", service=TaskLockService(backend), ttl=30, refresh_interval=0.1
    )
    def kept() -> str:
        checkpoint()
        return "fine"

    assert kept() == "fine"


def test_on_lost_raise_cancels_async_work(any_backend: ContractBackend, key: str) -> None:
    backend = any_backend.backend

    @exclusive(
        key, on_lost="raise", service=TaskLockService(backend), ttl=30, refresh_interval=0.1
    )
    async def work() -> None:
        await sync_to_async(lose, thread_sensitive=True)(backend, key)
        await asyncio.sleep(PATIENCE * 3)

    async def main() -> None:
        with pytest.raises(LockLost) as caught:
            await work()
        assert caught.value.key == key

    run(backend, main())


def test_run_exclusive_fn_reaches_its_lock_to_stop_itself() -> None:
    backend = MemoryBackend()

    def work() -> None:
        held = current_lock()
        assert held is not None
        lose(backend, "fn")
        while True:
            held.raise_if_lost()
            held.lost_event.wait(0.01)

    with pytest.raises(LockLost):
        TaskLockService(backend).run_exclusive("fn", work, ttl=30, refresh_interval=0.1)
    assert backend.list() == []


def test_module_level_run_exclusive_also_sets_current_lock(settings: Any) -> None:
    settings.TASKLOCK_BACKEND = "memory"
    result = run_exclusive("module-level", lambda: current_lock())
    assert result.result is not None
    assert result.result.key == "module-level"


def test_current_lock_is_per_thread() -> None:
    backend = MemoryBackend()
    seen: list[object] = []
    with TaskLockService(backend).lock("mine"):
        thread = threading.Thread(target=lambda: seen.append(current_lock()))
        thread.start()
        thread.join()
    assert seen == [None]
