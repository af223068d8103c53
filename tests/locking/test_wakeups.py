"""Waiters woken by a release of their key in the same process (locking/wakeups.py).

Here a waiter's pause is at least half an hour (its backoff made so, the
holder's lease an hour, its ``wait`` an hour), so a waiter that takes the key
within ``PATIENCE`` can only have been woken: without the wake-up, each case
fails at that bound. No speed is asserted; the bound is generous.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async

from django_tasklock.api.service import TaskLockService
from django_tasklock.exceptions import LockNotAcquired
from django_tasklock.leases.tokens import new_token
from django_tasklock.locking import waiting, wakeups
from django_tasklock.locking.lock import Lock
from django_tasklock.testing import ContractBackend
from django_tasklock.testing.support import wait_until
from tests.support.waiters import in_thread

WAIT = 3600  # a waiter's whole wait, and the holder's lease: no pause ends before 1800 s
PATIENCE = 60  # a woken waiter has taken the key by then


@pytest.fixture(autouse=True)
def _pauses_longer_than_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "FIRST_PAUSE", 3600.0)
    monkeypatch.setattr(waiting, "MAX_PAUSE", 3600.0)
    monkeypatch.setattr(waiting, "POLL_PAUSE", 3600.0)


def test_a_release_between_a_look_and_the_pause_is_not_missed(
    any_backend: ContractBackend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release lands after the waiter found the key held, before it sleeps."""
    service = TaskLockService(any_backend.backend)
    holder = service.lock(key, ttl=WAIT)
    holder.acquire()
    original = waiting.Backoff.next_pause
    released: list[bool] = []

    def release_then_pause(
        backoff: waiting.Backoff, seconds_left: float | None, **told: bool
    ) -> float | None:
        if not released:
            released.append(True)
            holder.release()  # in the waiter's thread, between its look and its pause
        return original(backoff, seconds_left, **told)

    monkeypatch.setattr(waiting.Backoff, "next_pause", release_then_pause)

    def wait_for_the_key() -> bool:
        with service.lock(key, ttl=WAIT, wait=WAIT) as held:
            return not held.lost

    thread, outcome = in_thread(any_backend, wait_for_the_key)
    thread.join(PATIENCE)
    assert outcome == [True], "the release before the pause was missed"
    assert released == [True]


def _waiters(key: str) -> int:
    with wakeups._mutex:
        return len(wakeups._waiters.get(key, ()))


def _holding(any_backend: ContractBackend, key: str) -> Lock:
    """``key`` held for longer than the test."""
    holder = TaskLockService(any_backend.backend).lock(key, ttl=WAIT)
    holder.acquire()
    return holder


def _held_by_waiter(
    any_backend: ContractBackend,
    holder: Lock,
    until: Callable[[], bool],
    *,
    asyncio_task: bool = False,
) -> bool:
    """A waiter of ``holder``'s key (a thread, or an asyncio task); once ``until()``
    holds, ``holder`` releases the key. True if the waiter then held it.

    The asyncio task's holder releases from another thread, as a worker's would.
    """
    service, key = TaskLockService(any_backend.backend), holder.key
    if not asyncio_task:

        def wait_for_the_key() -> bool:
            with service.lock(key, ttl=WAIT, wait=WAIT) as held:
                return not held.lost

        thread, outcome = in_thread(any_backend, wait_for_the_key)
        wait_until(until, timeout=PATIENCE)
        holder.release()
        thread.join(PATIENCE)
        return outcome == [True]

    async def main() -> bool:
        async def wait_for_the_key() -> bool:
            async with service.lock(key, ttl=WAIT, wait=WAIT) as held:
                return not held.lost

        waiter = asyncio.ensure_future(wait_for_the_key())
        for _ in range(PATIENCE * 100):
            if until() or waiter.done():
                break
            await asyncio.sleep(0.01)
        try:
            await sync_to_async(release_and_close, thread_sensitive=False)()
            return await asyncio.wait_for(waiter, PATIENCE)
        finally:
            await sync_to_async(any_backend.backend.close)()  # the ORM thread's connections

    def release_and_close() -> None:
        try:
            holder.release()
        finally:
            any_backend.backend.close()

    return asyncio.run(main())


@pytest.mark.parametrize("asyncio_task", [False, True], ids=["thread", "asyncio"])
def test_a_release_wakes_a_waiter_of_its_key(
    any_backend: ContractBackend, key: str, asyncio_task: bool
) -> None:
    holder = _holding(any_backend, key)
    assert _held_by_waiter(  # once asleep: a pause of half an hour at least
        any_backend, holder, lambda: _waiters(key) == 1, asyncio_task=asyncio_task
    ), "not woken by the release"
    assert _waiters(key) == 0


def test_each_release_wakes_the_waiters_until_all_took_the_key(
    any_backend: ContractBackend, key: str
) -> None:
    """Two waiters, both woken by the first release: one takes the key, the other
    sleeps again, and is woken by the release of the one that took it."""
    service = TaskLockService(any_backend.backend)
    order: list[str] = []
    holder = service.lock(key, ttl=WAIT)
    holder.acquire()

    def waiter(name: str) -> Callable[[], object]:
        def run() -> object:
            with service.lock(key, ttl=WAIT, wait=WAIT):
                order.append(name)
            return name

        return run

    threads = [in_thread(any_backend, waiter(name)) for name in ("a", "b")]
    wait_until(lambda: _waiters(key) == 2, timeout=PATIENCE)
    holder.release()
    for thread, _ in threads:
        thread.join(PATIENCE)
    assert sorted(order) == ["a", "b"]
    assert [outcome for _, outcome in threads] in ([["a"], ["b"]], [["b"], ["a"]])


def test_a_waiter_not_woken_gives_up_at_its_wait(any_backend: ContractBackend, key: str) -> None:
    """The wake-up only brings a look forward: with none, the pause is the bound."""
    service = TaskLockService(any_backend.backend)
    with service.lock(key, ttl=60):
        with pytest.raises(LockNotAcquired), service.lock(key, ttl=60, wait=0.2):
            pytest.fail("acquired while held")
        assert _waiters(key) == 0


def _requests(backend: object, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """From now on, each look at a key (``peek``) and each ask for it (``acquire``) and
    its answer, in order."""
    requests: list[str] = []
    peek, acquire = backend.peek, backend.acquire  # type: ignore[attr-defined]

    def counted_peek(key: str) -> object:
        requests.append("peek")
        return peek(key)

    def counted_acquire(key: str, token: str, **options: object) -> bool:
        granted = bool(acquire(key, token, **options))
        requests.append(f"acquire: {granted}")  # once answered
        return granted

    monkeypatch.setattr(backend, "peek", counted_peek)
    monkeypatch.setattr(backend, "acquire", counted_acquire)
    return requests


@pytest.mark.parametrize("asyncio_task", [False, True], ids=["thread", "asyncio"])
def test_a_woken_waiter_asks_for_the_key_without_a_look_first(
    any_backend: ContractBackend, key: str, monkeypatch: pytest.MonkeyPatch, asyncio_task: bool
) -> None:
    """The release says the key is free: the next request is for the key, not a read
    of it that would only delay the grant by a round trip."""
    holder = _holding(any_backend, key)
    requests = _requests(any_backend.backend, monkeypatch)
    assert _held_by_waiter(  # once refused: it pauses
        any_backend, holder, lambda: requests == ["acquire: False"], asyncio_task=asyncio_task
    ), "not woken by the release"
    assert requests == ["acquire: False", "acquire: True"]


def _overtaken(backend: object, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The waiter's answers; at its second ask (woken), another takes the key first,
    for 1 s, and never releases it (as a holder that died)."""
    answers: list[bool] = []
    acquire = backend.acquire  # type: ignore[attr-defined]

    def overtaken(key: str, token: str, **options: object) -> bool:
        if len(answers) == 1:
            taken = acquire(
                key, new_token(), ttl=timedelta(seconds=1), max_lifetime=timedelta(hours=1)
            )
            assert taken
        granted = bool(acquire(key, token, **options))
        answers.append(granted)
        return granted

    monkeypatch.setattr(backend, "acquire", overtaken)
    return answers


@pytest.mark.parametrize("asyncio_task", [False, True], ids=["thread", "asyncio"])
def test_a_woken_waiter_that_loses_the_key_waits_no_longer_than_the_new_lease(
    any_backend: ContractBackend, key: str, monkeypatch: pytest.MonkeyPatch, asyncio_task: bool
) -> None:
    """Its INSERT, sent at once, loses to another taker's: it reads the key soon after,
    and takes it once that lease has run out, not after its backoff (half an hour)."""
    holder = _holding(any_backend, key)
    answers = _overtaken(any_backend.backend, monkeypatch)
    assert _held_by_waiter(  # once refused: it pauses
        any_backend, holder, lambda: answers == [False], asyncio_task=asyncio_task
    ), "slept past the new holder's lease"
    assert answers[:2] == [False, False]  # refused, then overtaken
    assert answers[-1], "never granted"
