"""Contract cases: the lock object, waiting, and min_hold kept by the storage."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.base import BaseBackend, Refresh, Released
from django_tasklock.exceptions import LockNotAcquired
from django_tasklock.leases.lease import new_token
from django_tasklock.testing.support import LIFE, LONG, SLACK, SignalRecorder


class LockCases:
    """``with``/``async with`` a lock, ``wait=``, and ``min_hold=`` on every backend."""

    # -- the context managers ------------------------------------------------------

    def test_with_block_holds_the_key_and_releases_it(
        self, service: TaskLockService, backend: BaseBackend, key: str, signals: SignalRecorder
    ) -> None:
        with service.lock(key, ttl=30) as lock:
            held = backend.peek(key)
            assert held is not None
            assert held.holder == lock.holder
            assert not lock.lost
            assert not backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
        assert backend.peek(key) is None
        assert not lock.held
        assert [name for name, _ in signals.sent] == ["acquired", "released"]

    def test_with_block_on_a_held_key_raises_lock_not_acquired(
        self, service: TaskLockService, backend: BaseBackend, key: str
    ) -> None:
        assert backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
        ran = []
        with pytest.raises(LockNotAcquired) as info, service.lock(key):
            ran.append(True)  # pragma: no cover - must not run
        assert info.value.key == key
        assert repr(key) in str(info.value)
        assert ran == []

    def test_async_with_holds_the_key_and_releases_it(
        self, service: TaskLockService, backend: BaseBackend, key: str
    ) -> None:
        async def main() -> bool:
            try:
                async with service.lock(key, ttl=30) as lock:
                    return await sync_to_async(backend.peek)(key) is not None and lock.held
            finally:
                await sync_to_async(backend.close)()  # the thread the lock's calls ran in

        assert asyncio.run(main())
        assert backend.peek(key) is None

    # -- waiting ---------------------------------------------------------------------

    def test_waiter_takes_the_key_soon_after_the_lease_ends(
        self, service: TaskLockService, backend: BaseBackend, key: str
    ) -> None:
        assert backend.acquire(key, new_token(), ttl=timedelta(seconds=0.8), max_lifetime=LIFE)
        start = time.monotonic()
        with service.lock(key, ttl=30, wait=5) as lock:
            waited = time.monotonic() - start
            assert lock.held
        assert 0.8 - SLACK <= waited <= 0.8 + 1.0 + SLACK  # at most one longest pause late

    def test_waiter_takes_the_key_when_the_holder_releases_early(
        self, service: TaskLockService, backend: BaseBackend, key: str
    ) -> None:
        import threading

        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)

        def release_soon() -> None:
            time.sleep(0.4)
            try:
                backend.release(key, token)
            finally:
                backend.close()  # this thread's connections die with it

        releaser = threading.Thread(target=release_soon)
        releaser.start()
        try:
            result = service.run_exclusive(key, lambda: "ran", wait=5)
        finally:
            releaser.join()
        assert (result.acquired, result.result) == (True, "ran")

    def test_waiting_gives_up_at_its_deadline(
        self, service: TaskLockService, backend: BaseBackend, key: str
    ) -> None:
        assert backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
        start = time.monotonic()
        result = service.run_exclusive(key, lambda: None, wait=0.5)
        assert not result.acquired
        assert 0.5 <= time.monotonic() - start <= 0.5 + SLACK

    # -- min_hold ----------------------------------------------------------------------

    def test_release_with_min_hold_keeps_the_key_until_acquisition_plus_min_hold(
        self, backend: BaseBackend, key: str
    ) -> None:
        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.release(key, token, min_hold=timedelta(seconds=0.8))
        held = backend.peek(key)
        assert held is not None
        assert 0.8 - SLACK <= held.seconds_left <= 0.8
        assert not backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
        assert not backend.refresh(key, new_token(), ttl=LONG, max_lifetime=LIFE)
        time.sleep(0.9)
        assert backend.peek(key) is None
        assert backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)

    def test_a_refresh_after_a_min_hold_release_never_extends_the_lease(
        self, backend: BaseBackend, key: str
    ) -> None:
        # A refresh sent before the release that reaches the storage after it (its
        # client gave it up and the release went on): it must not undo the cut.
        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.release(key, token, min_hold=timedelta(seconds=5))
        assert not backend.refresh(key, token, ttl=LONG, max_lifetime=LIFE)
        [answer] = backend.refresh_many([Refresh(key, token, LONG, LIFE)])
        assert not answer
        held = backend.peek(key)
        assert held is not None
        assert held.seconds_left <= 5, f"the cut lease was extended: {held}"
        again = backend.release_outcome(key, token, min_hold=timedelta(seconds=5))
        assert again is not Released.LOST  # the same release sent again: no loss
        assert backend.force_release(key) is not None

    def test_min_hold_longer_than_the_ttl_holds_past_the_lease(
        self, backend: BaseBackend, key: str
    ) -> None:
        token = new_token()
        assert backend.acquire(key, token, ttl=timedelta(seconds=0.5), max_lifetime=LIFE)
        assert backend.release(key, token, min_hold=timedelta(seconds=1.2))
        time.sleep(0.7)  # past the ttl, not past acquisition + min_hold
        assert not backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
        time.sleep(0.7)
        assert backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)

    def test_release_after_min_hold_has_passed_deletes(
        self, backend: BaseBackend, key: str
    ) -> None:
        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        time.sleep(0.3)
        assert backend.release(key, token, min_hold=timedelta(seconds=0.2))
        assert backend.peek(key) is None

    def test_min_hold_never_revives_or_touches_what_is_not_ours(
        self, backend: BaseBackend, key: str
    ) -> None:
        hold = timedelta(seconds=30)
        token, other = new_token(), new_token()
        assert backend.acquire(key, token, ttl=timedelta(seconds=0.2), max_lifetime=LIFE)
        time.sleep(0.3)
        assert not backend.release(key, token, min_hold=hold)  # expired: lost, not revived
        assert backend.peek(key) is None
        assert backend.acquire(key, other, ttl=timedelta(seconds=0.5), max_lifetime=LIFE)
        assert not backend.release(key, token, min_hold=hold)
        held = backend.peek(key)
        assert held is not None
        assert held.seconds_left <= 0.5

    def test_run_exclusive_with_min_hold_blocks_the_next_run_until_it_passes(
        self, service: TaskLockService, key: str
    ) -> None:
        first = service.run_exclusive(key, lambda: "quick", min_hold=0.8)
        assert (first.acquired, first.result, first.lost) == (True, "quick", False)
        assert not service.run_exclusive(key, lambda: None).acquired
        later = service.run_exclusive(key, lambda: "next", wait=2)
        assert later.acquired
