"""A loss only the release finds: callers who asked to stop get LockLost, for the true reason.

The work force-releases its own key and returns before any refresh could
notice, so the release is the first to find the lease gone. With
``cancel_on_loss=True`` (``async with``, ``arun_exclusive``) or
``@exclusive(on_lost="raise")`` the caller was promised ``LockLost`` for a
result made partly without the lock. And a release that finds its own lease
run out (sent after the local deadline, here because a ``min_hold`` release
waits for a refresh that hangs) declares ``"expired"``, not an operator's
release.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async

from django_tasklock import LockLost, TaskLockService, exclusive
from django_tasklock.backends.base import Refresh
from django_tasklock.reasons import EXPIRED, RELEASED_BY_OPERATOR
from django_tasklock.testing import ContractBackend
from django_tasklock.testing.delegate import DelegatingBackend
from tests.locking.test_loss import run


def test_async_with_cancel_on_loss_raises_a_loss_found_by_the_release(
    any_backend: ContractBackend, key: str
) -> None:
    backend = any_backend.backend

    async def main() -> None:
        async with TaskLockService(backend).lock(
            key, cancel_on_loss=True, ttl=30, refresh_interval=10
        ):
            await sync_to_async(backend.force_release, thread_sensitive=True)(key)

    with pytest.raises(LockLost) as raised:
        run(backend, main())
    assert raised.value.reason == RELEASED_BY_OPERATOR


def test_arun_exclusive_cancel_on_loss_raises_a_loss_found_by_the_release(
    any_backend: ContractBackend, key: str
) -> None:
    backend = any_backend.backend

    async def body() -> int:
        await sync_to_async(backend.force_release, thread_sensitive=True)(key)
        return 1

    with pytest.raises(LockLost):
        run(
            backend,
            TaskLockService(backend).arun_exclusive(
                key, body, cancel_on_loss=True, ttl=30, refresh_interval=10
            ),
        )


def test_exclusive_on_lost_raise_raises_a_loss_found_by_the_release(
    any_backend: ContractBackend, key: str
) -> None:
    backend = any_backend.backend

    @exclusive(key, on_lost="raise", service=TaskLockService(backend), ttl=30, refresh_interval=10)
    def work() -> int:
        backend.force_release(key)
        return 5

    with pytest.raises(LockLost) as raised:
        work()
    assert raised.value.reason == RELEASED_BY_OPERATOR


class _HangingRefreshes(DelegatingBackend):
    def refresh_many(self, items: Sequence[Refresh]) -> list[bool]:
        time.sleep(1.0)  # a refresh that does not answer in time
        return super().refresh_many(items)


def test_a_release_sent_after_the_deadline_declares_an_expiry(
    any_backend: ContractBackend, key: str
) -> None:
    service = TaskLockService(_HangingRefreshes(any_backend.backend))
    lock = service.lock(key, ttl=0.5, refresh_interval=0.1, min_hold=timedelta(milliseconds=1))
    lock.acquire()
    time.sleep(0.15)  # a refresh is under way: the min_hold release waits for it, past the ttl
    lock.release()
    # The late refresh may still find the lease ours (then the release ends
    # it, no loss); if it was lost, it ran out: never an operator's release.
    assert lock._lease is not None
    assert not lock.lost or lock._lease.reason == EXPIRED
