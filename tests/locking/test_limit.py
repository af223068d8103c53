"""``limit=N`` on the lock API: at most N holders of a key at once, each a permit.

On every backend that gives permits (memory, SQLite, PostgreSQL, MariaDB):
N holders at once and the next refused, a limit that disagrees refused,
each permit kept alive by the heartbeat and released alone, fences strictly
increasing across permits, a waiter given a released permit. And what must
not change: ``limit=1`` makes exactly the storage calls it made before.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from django_tasklock import TaskLockService, exclusive
from django_tasklock.backends.base import (
    BaseBackend,
    Capabilities,
    Released,
    lease_id,
    longest_limited_key,
    permit_key,
)
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.exceptions import LimitMismatch, LockNotAcquired
from django_tasklock.locking.lock import Lock
from django_tasklock.locking.options import MAX_LIMIT
from django_tasklock.testing import ContractBackend

pytestmark = pytest.mark.databases

#: Generous bound on anything the heartbeat is waited for.
BOUND = 30.0


@pytest.fixture
def backend(any_backend: ContractBackend) -> BaseBackend:
    """Every backend: they all give permits."""
    return any_backend.backend


@pytest.fixture
def service(backend: BaseBackend) -> TaskLockService:
    return TaskLockService(backend)


def _until(condition: Any, what: str, bound: float = BOUND) -> None:
    """Poll ``condition`` until it holds, failing after ``bound`` seconds."""
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, f"not within {bound} s: {what}"
        time.sleep(0.02)


class Recording(MemoryBackend):
    """A memory backend that records every storage call: (method, name asked for)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []
        self._in_outcome = False

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        self.calls.append(("acquire", key))
        return super().acquire(key, token, ttl=ttl, max_lifetime=max_lifetime)

    def acquire_permit(
        self, key: str, token: str, *, limit: int, ttl: timedelta, max_lifetime: timedelta
    ) -> str | None:
        self.calls.append(("acquire_permit", key))
        return super().acquire_permit(key, token, limit=limit, ttl=ttl, max_lifetime=max_lifetime)

    def refresh(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        self.calls.append(("refresh", key))
        return super().refresh(key, token, ttl=ttl, max_lifetime=max_lifetime)

    def release(self, key: str, token: str, *, min_hold: timedelta | None = None) -> bool:
        if not self._in_outcome:  # not the call release_outcome makes (BaseBackend's)
            self.calls.append(("release", key))
        return super().release(key, token, min_hold=min_hold)

    def release_outcome(
        self, key: str, token: str, *, min_hold: timedelta | None = None
    ) -> Released:
        self.calls.append(("release_outcome", key))
        self._in_outcome = True
        try:
            return super().release_outcome(key, token, min_hold=min_hold)
        finally:
            self._in_outcome = False

    def fence(self, key: str, token: str) -> int | None:
        self.calls.append(("fence", key))
        return super().fence(key, token)

    def peek(self, key: str) -> Any:
        self.calls.append(("peek", key))
        return super().peek(key)


# -- validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (True, TypeError),
        (False, TypeError),
        (2.0, TypeError),
        ("2", TypeError),
        (None, TypeError),
        (0, ValueError),
        (-3, ValueError),
        (MAX_LIMIT + 1, ValueError),
    ],
)
def test_a_bad_limit_is_named_and_nothing_is_written(value: object, error: type) -> None:
    backend = Recording()
    service = TaskLockService(backend)
    with pytest.raises(error, match="limit"):
        service.lock("k", limit=value)  # type: ignore[arg-type]
    with pytest.raises(error, match="limit"):
        service.run_exclusive("k", lambda: None, limit=value)  # type: ignore[arg-type]
    with pytest.raises(error, match="limit"):
        asyncio.run(service.arun_exclusive("k", asyncio.sleep, limit=value))  # type: ignore[arg-type]

    bad: Any = value

    @exclusive("export:{tenant_id}", limit=bad, service=service)
    def export(tenant_id: int) -> None:
        raise AssertionError("ran")

    with pytest.raises(error, match="limit"):
        export(7)
    assert backend.calls == []


def test_a_key_too_long_for_its_permits_names_key_and_writes_nothing() -> None:
    backend = Recording()
    longest = "k" * longest_limited_key(3)
    Lock(longest, backend=backend, limit=3)  # fits
    with pytest.raises(ValueError, match="key must be at most"):
        Lock(longest + "k", backend=backend, limit=3)
    Lock(longest + "k", backend=backend)  # a mutex's key may be longer
    assert backend.calls == []


def test_a_backend_without_permits_is_refused_before_any_write() -> None:
    class NoPermits(Recording):
        capabilities = Capabilities(cross_process=False, server_clock=False, permits=False)

    backend = NoPermits()
    lock = TaskLockService(backend).lock("k", limit=2)
    with pytest.raises(NotImplementedError, match=r"limit=2 .*NoPermits"):
        lock.try_acquire()
    with pytest.raises(NotImplementedError, match="limit=2"):
        TaskLockService(backend).run_exclusive("k", lambda: None, limit=2)
    assert backend.calls == []
    assert not lock.held
    assert TaskLockService(backend).run_exclusive("k", lambda: 1).result == 1  # limit=1 works


def test_limit_is_no_project_default() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from django_tasklock.locking.options import project_defaults

    with pytest.raises(ImproperlyConfigured, match="unknown keys"):
        project_defaults({"limit": 3})


# -- limit=1 is the mutex, call for call --------------------------------------------


def test_limit_one_makes_the_same_storage_calls_as_before() -> None:
    """The storage calls of a mutex, with and without ``limit=1``, are the ones the
    lock made before ``limit`` existed (this test passes on the commit before it)."""
    for options in ({}, {"limit": 1}):
        backend = Recording()
        service = TaskLockService(backend)
        with service.lock("k", fencing=True, **options) as held:  # type: ignore[arg-type]
            assert held.permit is None
            assert held.fence == 1
            other = service.lock("k", wait=0.2, **options)  # type: ignore[arg-type]
            assert not other.try_acquire()
        service.run_exclusive("k", lambda: None, **options)  # type: ignore[arg-type]
        calls = backend.calls
        assert calls[:3] == [("acquire", "k"), ("fence", "k"), ("acquire", "k")]
        # The waiter read before it asked again, never for a permit.
        assert set(calls[3:-3]) == {("peek", "k")}
        assert calls[-3:] == [("release_outcome", "k"), ("acquire", "k"), ("release_outcome", "k")]


# -- on every backend with permits -------------------------------------------------


def test_n_threads_hold_the_key_at_once_and_the_next_is_refused(
    service: TaskLockService, backend: BaseBackend, key: str
) -> None:
    held = threading.Barrier(4)
    done = threading.Event()
    permits: list[int | None] = []
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with service.lock(key, limit=3) as lock:
                permits.append(lock.permit)
                held.wait(BOUND)
                done.wait(BOUND)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            held.abort()
        finally:
            connections.close_all()  # this thread's own

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        held.wait(BOUND)
        assert sorted(permits) == [0, 1, 2]  # type: ignore[type-var]
        fourth = service.lock(key, limit=3)
        assert not fourth.try_acquire()
        assert fourth.permit is None
        skipped = service.run_exclusive(key, lambda: None, limit=3)
        assert not skipped.acquired
    finally:
        done.set()
        for thread in threads:
            thread.join(BOUND)
    assert errors == []
    assert service.run_exclusive(key, lambda: None, limit=3).acquired


def test_a_limit_that_disagrees_with_the_held_permits_is_refused(
    service: TaskLockService, backend: BaseBackend, key: str
) -> None:
    with service.lock(key, limit=3):
        with pytest.raises(LimitMismatch) as refused:
            service.lock(key, limit=2).try_acquire()
        assert (refused.value.held, refused.value.asked) == (3, 2)
        with pytest.raises(LimitMismatch):
            service.run_exclusive(key, lambda: None)  # a mutex
    with service.lock(key):
        with pytest.raises(LimitMismatch) as refused:
            service.lock(key, limit=2).try_acquire()
        assert (refused.value.held, refused.value.asked) == (1, 2)


def test_the_heartbeat_keeps_each_permit_alive_past_its_ttl(
    service: TaskLockService, backend: BaseBackend, key: str
) -> None:
    locks = [service.lock(key, limit=3, ttl=2, refresh_interval=0.4) for _ in range(3)]
    for lock in locks:
        lock.acquire()
    try:
        leases = [lock._lease for lock in locks]
        assert all(lease is not None for lease in leases)
        # Confirmed by the storage after the ttl would have ended unrefreshed.
        _until(
            lambda: all(x is not None and x.answered_at > x.asked_at + 2.2 for x in leases),
            "every permit refreshed past its first ttl",
        )
        for lock, lease in zip(locks, leases, strict=True):
            assert lease is not None
            assert not lock.lost
            found = backend.peek(lease.stored_as)
            assert found is not None
            assert found.lease == lease_id(lease.token)
            assert lease.stored_as == permit_key(key, lock.permit or 0)
        assert not service.lock(key, limit=3).try_acquire()
    finally:
        for lock in locks:
            lock.release()
    assert not any(lock.lost for lock in locks)


def test_a_release_frees_exactly_that_permit(
    service: TaskLockService, backend: BaseBackend, key: str
) -> None:
    locks = [service.lock(key, limit=3) for _ in range(3)]
    for lock in locks:
        lock.acquire()
    middle = next(lock for lock in locks if lock.permit == 1)
    middle.release()
    assert middle.permit == 1  # kept after release, as holder
    assert backend.peek(permit_key(key, 1)) is None
    for lock in locks:
        if lock is not middle:
            assert backend.peek(permit_key(key, lock.permit or 0)) is not None
    again = service.lock(key, limit=3)
    assert again.try_acquire()
    assert again.permit == 1
    for lock in (*locks, again):
        if lock.held:
            lock.release()
    assert [backend.peek(permit_key(key, n)) for n in range(3)] == [None, None, None]


def test_fences_strictly_increase_across_permits(service: TaskLockService, key: str) -> None:
    fences: list[int] = []
    held: list[Lock] = []
    for step in range(6):
        if len(held) == 2 or step == 4:
            held.pop(0).release()
        lock = service.lock(key, limit=2, fencing=True)
        lock.acquire()
        assert lock.fence is not None
        fences.append(lock.fence)
        held.append(lock)
    held.pop(0).release()
    result = service.run_exclusive(key, lambda: None, limit=2, fencing=True)
    assert result.fence is not None
    assert result.permit is not None
    fences.append(result.fence)
    for lock in held:
        lock.release()
    assert fences == sorted(set(fences)), fences


def test_a_waiter_gets_a_permit_once_one_is_released(
    service: TaskLockService, backend: BaseBackend, key: str
) -> None:
    first, second = service.lock(key, limit=2), service.lock(key, limit=2)
    first.acquire()
    second.acquire()
    got: list[int | None] = []
    started = threading.Event()

    def wait() -> None:
        try:
            waiter = service.lock(key, limit=2, wait=BOUND)
            started.set()
            with waiter:
                got.append(waiter.permit)
        finally:
            connections.close_all()  # this thread's own

    thread = threading.Thread(target=wait)
    thread.start()
    started.wait(BOUND)
    assert not service.lock(key, limit=2).try_acquire()  # both held yet
    freed = second.permit
    second.release()
    thread.join(BOUND)
    assert got == [freed]
    first.release()


def test_an_async_waiter_gets_a_permit_once_one_is_released(
    service: TaskLockService, key: str
) -> None:
    async def main() -> int | None:
        holder = service.lock(key, limit=2)
        other = service.lock(key, limit=2)
        await holder.aacquire()
        await other.aacquire()
        waiter = service.lock(key, limit=2, wait=BOUND)
        task = asyncio.ensure_future(waiter.aacquire())
        await asyncio.sleep(0.1)
        assert not task.done()
        await other.arelease()
        await asyncio.wait_for(task, BOUND)
        permit = waiter.permit
        await waiter.arelease()
        await holder.arelease()
        # The connection Django's async ORM thread opened (the locks' as well): closed.
        await sync_to_async(connections.close_all, thread_sensitive=True)()
        assert permit == other.permit
        return permit

    assert asyncio.run(main()) is not None


def test_wait_runs_out_with_every_permit_held(service: TaskLockService, key: str) -> None:
    with (
        service.lock(key, limit=2),
        service.lock(key, limit=2),
        pytest.raises(LockNotAcquired),
    ):
        service.lock(key, limit=2, wait=0.3).acquire()


# -- an interrupted request ---------------------------------------------------------


def test_an_interrupt_inside_a_permits_request_releases_what_it_granted() -> None:
    class GrantsThenInterrupted(MemoryBackend):
        """The storage grants a permit, then Ctrl-C arrives before the caller knows which."""

        interrupt = False

        def acquire_permit(
            self, key: str, token: str, *, limit: int, ttl: timedelta, max_lifetime: timedelta
        ) -> str | None:
            name = super().acquire_permit(
                key, token, limit=limit, ttl=ttl, max_lifetime=max_lifetime
            )
            assert name is not None
            if self.interrupt:
                raise KeyboardInterrupt
            return name

    backend = GrantsThenInterrupted()
    service = TaskLockService(backend)
    with service.lock("k", limit=3), service.lock("k", limit=3):  # permits 0 and 1 held
        ran: list[bool] = []
        backend.interrupt = True
        with pytest.raises(KeyboardInterrupt):
            service.run_exclusive("k", lambda: ran.append(True), limit=3)
        assert ran == []
        assert backend.peek(permit_key("k", 2)) is None  # the interrupted one's, released
        assert backend.peek(permit_key("k", 0)) is not None  # the others' kept
        assert backend.peek(permit_key("k", 1)) is not None
    assert backend.list() == []


def test_a_failing_fence_of_a_permit_releases_that_permit_only() -> None:
    class FenceFails(Recording):
        def fence(self, key: str, token: str) -> int | None:
            super().fence(key, token)
            raise ConnectionError("storage went away")

    backend = FenceFails()
    service = TaskLockService(backend)
    with pytest.raises(ConnectionError):
        service.lock("k", limit=3, fencing=True).acquire()
    name = permit_key("k", 0)
    assert backend.calls == [("acquire_permit", "k"), ("fence", name), ("release", name)]
    assert backend.list() == []


def test_every_call_for_a_held_permit_names_the_permit() -> None:
    """The heartbeat's refreshes and the release name the permit, not the key."""
    backend = Recording()
    service = TaskLockService(backend)
    lock = service.lock("k", limit=2, ttl=1, refresh_interval=0.05)
    lock.acquire()
    name = permit_key("k", 0)
    _until(lambda: ("refresh", name) in backend.calls, "a refresh of the permit")
    lock.release()
    assert backend.calls[0] == ("acquire_permit", "k")
    assert {what for what, _ in backend.calls[1:]} == {"refresh", "release_outcome"}
    assert {called for _, called in backend.calls[1:]} == {name}


def test_min_hold_keeps_that_permit_held_after_the_release(
    service: TaskLockService, backend: BaseBackend, key: str
) -> None:
    first = service.lock(key, limit=2, min_hold=timedelta(minutes=5))
    first.acquire()
    first.release()
    assert not first.lost
    assert backend.peek(permit_key(key, first.permit or 0)) is not None  # kept by the storage
    second = service.lock(key, limit=2)
    assert second.try_acquire()  # the other permit
    assert second.permit != first.permit
    assert not service.lock(key, limit=2).try_acquire()
    second.release()
    backend.force_release(permit_key(key, first.permit or 0))


def test_skipped_work_says_all_permits_were_held(caplog: pytest.LogCaptureFixture) -> None:
    backend = Recording()
    service = TaskLockService(backend)
    with service.lock("k", limit=2), service.lock("k", limit=2):
        backend.calls.clear()
        with caplog.at_level("INFO", logger="django_tasklock"):
            assert not service.run_exclusive("k", lambda: None, limit=2).acquired
        assert backend.calls == [("acquire_permit", "k")]  # no peek of the key: it has no lease
    assert "all 2 permits of task lock 'k' were held" in caplog.text


def test_an_async_function_under_a_limit() -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)
    permits: list[int | None] = []

    @exclusive("export:{tenant_id}", limit=2, service=service)
    async def export(tenant_id: int) -> str:
        from django_tasklock import current_lock

        held = current_lock()
        assert held is not None
        permits.append(held.permit)
        return "ran"

    async def main() -> list[str | None]:
        holder = service.lock("export:7", limit=2)
        await holder.aacquire()
        ran = await export(7)
        other = service.lock("export:7", limit=2)
        await other.aacquire()
        skipped = await export(7)
        await other.arelease()
        await holder.arelease()
        return [ran, skipped]

    assert asyncio.run(main()) == ["ran", None]
    assert permits == [1]


def test_leadership_and_unique_claims_take_no_limit() -> None:
    from django_tasklock import Leadership
    from django_tasklock.api.unique import ClaimedLock

    backend = Recording()
    with pytest.raises(TypeError, match="limit"):
        Leadership("leader", limit=2, backend=backend)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="limit"):
        ClaimedLock("unique", "token", ttl=5, limit=2, backend=backend)
    assert backend.calls == []


def test_a_delegating_backend_passes_permits_on() -> None:
    """``testing.DelegatingBackend`` says it gives permits when its inner one does:
    it must forward the request (it answered NotImplementedError at the grant)."""
    from django_tasklock.testing.delegate import DelegatingBackend

    backend = DelegatingBackend(MemoryBackend())
    assert backend.capabilities.permits
    result = TaskLockService(backend).run_exclusive("exports", lambda: 7, limit=2)
    assert (result.acquired, result.result, result.permit) == (True, 7, 0)
