"""A system suspend: the lease's clock jumps ahead while the threads' sleeps do not.

Local deadlines are read off ``CLOCK_BOOTTIME``, which counts a suspend; the
heartbeat and the deadline watcher sleep in ``Condition.wait``, on
``CLOCK_MONOTONIC``, which does not. After a resume the lease simply ran out
(the storage let it go meanwhile): it must be declared ``"expired"``, not
``released_by_operator`` or ``taken``, and soon, whichever thread wakes
first. The suspend is emulated: the lease clock (``django_tasklock.leases.lease.
clock``, a stand-in clock) jumps ahead while the threads sleep on, and the
key is deleted from the real storage, as its expiry there would.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.base import Refresh
from django_tasklock.leases import lease as lease_module
from django_tasklock.leases import ticks
from django_tasklock.leases.heartbeat import heartbeat
from django_tasklock.leases.watchdog import watcher
from django_tasklock.reasons import EXPIRED
from django_tasklock.signals import lock_lost
from django_tasklock.testing import ContractBackend

#: Longer than every ttl below: the lease ran out during the suspend.
SUSPEND = 60.0
#: The deadline watcher notices a suspend within this (its longest sleep).
SLICE = 1.0
#: For a thread waiting for its turn on this shared, loaded machine.
SLACK = 1.0


class SuspendableClock:
    """``CLOCK_BOOTTIME`` plus the seconds "suspended" so far."""

    def __init__(self) -> None:
        self.real = lease_module.clock
        self.suspended = 0.0

    def __call__(self) -> float:
        return self.real() + self.suspended

    def suspend(self, seconds: float) -> None:
        self.suspended += seconds


@pytest.fixture
def boottime(monkeypatch: pytest.MonkeyPatch) -> SuspendableClock:
    """The lease clock, everywhere the package reads it, made suspendable.

    The heartbeat's recent ticks are put back afterwards (patched first, so
    restored last): ticks timed by the suspended clock look a minute long and
    end a minute ahead of the real one, so each would report this process's
    heartbeat behind (W012) for a minute of the tests that follow.
    """
    monkeypatch.setattr(ticks, "_last", ticks._last)
    monkeypatch.setattr(ticks, "_recent", ticks._recent)
    fake = SuspendableClock()
    for name, module in list(sys.modules.items()):
        if name.startswith("django_tasklock") and getattr(module, "clock", None) is fake.real:
            monkeypatch.setattr(module, "clock", fake)
    return fake


@pytest.fixture
def reasons(key: str) -> Iterator[list[Any]]:
    sent: list[Any] = []

    def receiver(sender: object, key: str, **kwargs: Any) -> None:
        if key == held_key:
            sent.append(kwargs.get("reason"))

    held_key = key
    lock_lost.connect(receiver, weak=False)
    yield sent
    lock_lost.disconnect(receiver)


def _wait_for(sent: list[Any], timeout: float) -> None:
    end = time.monotonic() + timeout
    while not sent and time.monotonic() < end:
        time.sleep(0.01)


def test_the_deadline_watcher_notices_a_suspend_within_its_slice(
    any_backend: ContractBackend, key: str, boottime: SuspendableClock, reasons: list[Any]
) -> None:
    # The heartbeat sleeps for its 10 s interval: only the watcher can notice.
    backend = any_backend.backend
    with TaskLockService(backend).lock(key, ttl=30, refresh_interval=10) as held:
        # Both threads asleep for longer than the test: an idle heartbeat looks
        # again by itself within a second, then sleeps until the first lease
        # due (ours, or one released earlier); the watcher starts with ours.
        def quiet() -> bool:
            return all(
                SLICE + SLACK + 1 <= thread._wake_at - boottime() < math.inf
                for thread in (heartbeat(), watcher())
            )

        end = time.monotonic() + 5
        while not quiet() and time.monotonic() < end:
            time.sleep(0.01)
        assert quiet()
        time.sleep(0.1)
        boottime.suspend(SUSPEND)
        backend.force_release(key)  # the storage let the lease go meanwhile
        resumed = time.monotonic()
        assert held.lost_event.wait(SLICE + SLACK + 3), "not declared after the resume"
        took = time.monotonic() - resumed
        _wait_for(reasons, 5)
    assert (held._lease and held._lease.reason) == EXPIRED
    assert reasons == [EXPIRED]
    assert took <= SLICE + SLACK, took


class _Recording:
    """The backend's own ``refresh_many``, noting the calls sent after the suspend."""

    def __init__(self, backend: Any, boottime: SuspendableClock) -> None:
        self.refresh_many = backend.refresh_many
        self.boottime = boottime
        self.answered = threading.Event()
        self.after_suspend = 0

    def __call__(self, items: Sequence[Refresh]) -> list[bool]:
        if self.boottime.suspended:
            self.after_suspend += 1
        answers: list[bool] = self.refresh_many(items)
        self.answered.set()
        return answers


def test_a_heartbeat_waking_first_declares_expired_without_a_refresh(
    any_backend: ContractBackend, key: str, boottime: SuspendableClock, reasons: list[Any]
) -> None:
    # The heartbeat's next refresh (0.5 s) is due before the watcher's next look.
    backend = any_backend.backend
    recording = _Recording(backend, boottime)
    backend.refresh_many = recording  # type: ignore[method-assign]
    with TaskLockService(backend).lock(key, ttl=30, refresh_interval=0.5) as held:
        assert recording.answered.wait(10)
        time.sleep(0.1)  # the answer handled; the next refresh is due 0.4 s from now
        boottime.suspend(SUSPEND)
        backend.force_release(key)
        resumed = time.monotonic()
        assert held.lost_event.wait(SLICE + SLACK + 3), "not declared after the resume"
        took = time.monotonic() - resumed
        _wait_for(reasons, 5)
        time.sleep(0.6)  # a refresh that would still be sent is sent by now
    assert reasons == [EXPIRED]
    assert took <= SLICE + SLACK, took
    assert recording.after_suspend == 0


def test_a_suspend_during_a_refresh_that_then_finds_the_lease_gone_is_expired(
    any_backend: ContractBackend, key: str, boottime: SuspendableClock, reasons: list[Any]
) -> None:
    backend = any_backend.backend
    refresh_many = backend.refresh_many
    suspended = threading.Event()

    def suspending(items: Sequence[Refresh]) -> list[bool]:
        if not suspended.is_set():
            # Suspended once the refresh was under way; meanwhile the storage
            # let the lease go, and the refresh, sent on resume, finds it gone.
            suspended.set()
            boottime.suspend(SUSPEND)
            backend.force_release(key)
        answers: list[bool] = refresh_many(items)
        return answers

    backend.refresh_many = suspending  # type: ignore[method-assign]
    with TaskLockService(backend).lock(key, ttl=30, refresh_interval=0.3) as held:
        assert suspended.wait(10)
        assert held.lost_event.wait(SLICE + SLACK + 3), "not declared after the resume"
        _wait_for(reasons, 5)
    assert reasons == [EXPIRED]
