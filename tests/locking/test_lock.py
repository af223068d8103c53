"""The Lock object's own rules: options, states, waiting by reads, faults around a grant."""

from __future__ import annotations

import pickle
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from django_tasklock import (
    LockNotAcquired,
    TaskLockError,
    TaskLockService,
    lock,
    lock_acquired,
    run_exclusive,
)
from django_tasklock.backends.base import BaseBackend, HeldLock
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.leases.lease import new_token

LONG, LIFE = timedelta(seconds=30), timedelta(hours=1)


class CountingBackend(MemoryBackend):
    """A memory backend that counts what a waiter asks of it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {"acquire": 0, "peek": 0}

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        self.calls["acquire"] += 1
        return super().acquire(key, token, ttl=ttl, max_lifetime=max_lifetime)

    def peek(self, key: str) -> HeldLock | None:
        self.calls["peek"] += 1
        return super().peek(key)


@pytest.fixture
def backend() -> MemoryBackend:
    return MemoryBackend()


@pytest.fixture
def service(backend: MemoryBackend) -> TaskLockService:
    return TaskLockService(backend)


@pytest.mark.parametrize(
    ("options", "error", "named"),
    [
        ({"wait": -1}, ValueError, "wait must not be negative"),
        ({"wait": timedelta(seconds=-1)}, ValueError, "wait must not be negative"),
        ({"wait": float("nan")}, ValueError, "wait"),
        ({"wait": "5"}, TypeError, "wait"),
        ({"min_hold": 0}, ValueError, "min_hold"),
        ({"min_hold": 7200, "max_lifetime": 3600}, ValueError, "min_hold"),
        ({"fencing": 1}, TypeError, "fencing"),
        ({"tll": 5}, TypeError, "tll"),
        ({"ttl": 0}, ValueError, "ttl"),
    ],
)
def test_bad_options_are_named_and_nothing_is_written(
    service: TaskLockService,
    backend: MemoryBackend,
    options: dict[str, Any],
    error: type[Exception],
    named: str,
) -> None:
    with pytest.raises(error, match=named):
        service.lock("k", **options)
    with pytest.raises(error, match=named):
        service.run_exclusive("k", lambda: None, **options)
    assert backend.list() == []


def test_wait_zero_or_none_means_no_waiting(service: TaskLockService) -> None:
    assert service.lock("k", wait=0).wait == timedelta(0)
    assert service.lock("k", wait=timedelta(0)).wait == timedelta(0)
    assert service.lock("k", wait=None).wait == timedelta(0)
    assert service.lock("k", wait=2.5).wait == timedelta(seconds=2.5)


def test_a_coroutine_function_given_to_run_exclusive_names_arun_exclusive(
    service: TaskLockService, backend: MemoryBackend
) -> None:
    async def work() -> None:  # pragma: no cover - never called
        pass

    with pytest.raises(TypeError, match="arun_exclusive"):
        service.run_exclusive("k", work)
    assert backend.list() == []


def test_lock_not_acquired_names_the_key_and_pickles() -> None:
    error = LockNotAcquired("rollups", timedelta(seconds=3))
    assert isinstance(error, TaskLockError)
    assert error.key == "rollups"
    assert "'rollups'" in str(error)
    assert "0:00:03" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.key, str(copy)) == ("rollups", str(error))


def test_lock_states_and_reuse(service: TaskLockService, backend: MemoryBackend) -> None:
    lock = service.lock("states", ttl=30)
    assert (lock.held, lock.holder, lock.lost, lock.fence) == (False, None, False, None)
    with pytest.raises(RuntimeError, match="not held"):
        lock.release()
    assert lock.acquire() is lock
    assert "held" in repr(lock)
    with pytest.raises(RuntimeError, match="already held"):
        lock.acquire()
    first_holder = lock.holder
    lock.release()
    assert not lock.held
    assert lock.holder == first_holder  # still says who held it
    with lock:  # again, with a new token
        assert backend.peek("states") is not None
    assert backend.list() == []


def test_lock_reports_a_lost_lease_while_held(
    service: TaskLockService, backend: MemoryBackend
) -> None:
    with service.lock("lost", ttl=0.3, refresh_interval=0.1) as lock:
        assert backend.force_release("lost")
        deadline = time.monotonic() + 3
        while not lock.lost and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lock.lost


def test_exception_in_the_block_releases_and_propagates(
    service: TaskLockService, backend: MemoryBackend
) -> None:
    with pytest.raises(KeyboardInterrupt), service.lock("boom"):
        raise KeyboardInterrupt
    assert backend.list() == []


def test_module_level_lock_uses_the_configured_backend(settings: Any) -> None:
    settings.TASKLOCK_BACKEND = "memory"
    with lock("module-level", ttl=30) as held:
        assert held.held
        assert not run_exclusive("module-level", lambda: None).acquired
    assert run_exclusive("module-level", lambda: "ran").result == "ran"


def test_a_waiter_polls_with_reads_not_inserts() -> None:
    backend = CountingBackend()
    assert backend.acquire("polled", new_token(), ttl=LONG, max_lifetime=LIFE)
    backend.calls = {"acquire": 0, "peek": 0}
    with pytest.raises(LockNotAcquired):
        TaskLockService(backend).lock("polled", wait=0.6).acquire()
    assert backend.calls["acquire"] == 1  # the first try; then reads only
    assert backend.calls["peek"] >= 3


def test_fencing_needs_a_backend_that_gives_fences() -> None:
    class NoFences(MemoryBackend):
        fence = BaseBackend.fence

    backend = NoFences()
    with pytest.raises(NotImplementedError, match="fencing"):
        TaskLockService(backend).run_exclusive("f", lambda: None, fencing=True)
    assert backend.list() == []
    with pytest.raises(NotImplementedError, match="NoFences"):
        backend.fence("f", new_token())


def test_a_lease_lost_before_it_was_fenced_is_no_grant() -> None:
    class LosesFirst(MemoryBackend):
        """The lease runs out between the acquisition and the fence, once."""

        lose = True

        def fence(self, key: str, token: str) -> int | None:
            if self.lose:
                self.lose = False
                self._leases[key].expires = self._clock()
            return super().fence(key, token)

    backend = LosesFirst()
    service = TaskLockService(backend)
    assert not service.run_exclusive("f", lambda: None, fencing=True).acquired
    assert backend.list() == []
    retried = service.run_exclusive("f", lambda: None, fencing=True, wait=1)
    assert (retried.acquired, retried.fence) == (True, 1)


def test_a_failing_fence_raises_and_leaves_nothing_held() -> None:
    class FenceFails(MemoryBackend):
        def fence(self, key: str, token: str) -> int | None:
            raise ConnectionError("storage went away")

    backend = FenceFails()
    with pytest.raises(ConnectionError):
        TaskLockService(backend).lock("f", fencing=True).acquire()
    assert backend.list() == []


def test_an_interrupt_right_after_the_grant_releases_the_key(
    service: TaskLockService, backend: MemoryBackend
) -> None:
    def interrupt(**kwargs: object) -> None:
        raise KeyboardInterrupt

    lock_acquired.connect(interrupt)
    try:
        lock = service.lock("interrupted")
        with pytest.raises(KeyboardInterrupt):
            lock.acquire()
    finally:
        lock_acquired.disconnect(interrupt)
    assert not lock.held
    assert backend.list() == []


def test_waiters_in_threads_each_get_their_turn(service: TaskLockService) -> None:
    order: list[int] = []

    def worker(n: int) -> None:
        def work() -> None:
            order.append(n)
            time.sleep(0.05)

        assert service.run_exclusive("turns", work, wait=10).acquired

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(order) == [0, 1, 2, 3, 4]


def test_an_interrupt_inside_the_acquisition_releases_what_it_granted() -> None:
    class GrantsThenInterrupted(MemoryBackend):
        """The storage grants the lease, then Ctrl-C arrives before the caller knows."""

        def acquire(
            self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta
        ) -> bool:
            assert super().acquire(key, token, ttl=ttl, max_lifetime=max_lifetime)
            raise KeyboardInterrupt

    backend = GrantsThenInterrupted()
    ran: list[bool] = []
    with pytest.raises(KeyboardInterrupt):
        TaskLockService(backend).run_exclusive("granted", lambda: ran.append(True))
    assert ran == []
    assert backend.list() == []
