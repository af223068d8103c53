"""progress_timeout: a holder that is alive but stuck loses its key; one that moves keeps it.

The holder is a thread of this process that acquires and then either blocks
forever (an ``Event`` nobody sets until the test ends) or calls
``progress()`` regularly; the contender is another lock on the same key and
backend, waiting for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import override_settings

from django_tasklock import TaskLockService, lock_stalled
from django_tasklock.backends.base import BaseBackend
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.locking.lock import Lock
from django_tasklock.locking.options import LockOptions
from django_tasklock.testing import ContractBackend
from tests.conftest import database_backend, redis_backend, require_service

#: Seconds of slack for a machine shared with busy neighbours.
SLACK = 1.5


@pytest.fixture
def stalled() -> Iterator[list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    def record(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs)

    lock_stalled.connect(record, weak=False)
    yield sent
    lock_stalled.disconnect(record)


def hold_in_thread(held: Lock, work: Any) -> tuple[threading.Thread, threading.Event]:
    """Acquire ``held`` in a thread that then runs ``work(held, done)``; set ``acquired``."""
    acquired = threading.Event()

    def run() -> None:
        with held:
            acquired.set()
            work(held)
        backend = held.backend
        backend.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert acquired.wait(30)
    return thread, acquired


def test_a_wedged_holder_loses_the_key_within_progress_timeout_plus_ttl(
    any_backend: ContractBackend, key: str, stalled: list[dict[str, Any]]
) -> None:
    backend = any_backend.backend
    service = TaskLockService(backend)
    ttl, progress_timeout = 1.0, 1.0
    unblock = threading.Event()
    holder = service.lock(key, ttl=ttl, refresh_interval=0.2, progress_timeout=progress_timeout)
    started = time.monotonic()
    thread, _ = hold_in_thread(holder, lambda held: unblock.wait(60))  # "forever"
    try:
        contender = service.lock(key, wait=progress_timeout + ttl + SLACK * 2)
        with contender:
            took = time.monotonic() - started
        # Kept alive for its first ttl at least, lost by progress_timeout + ttl.
        assert ttl <= took <= progress_timeout + ttl + SLACK, took
        assert [sent["key"] for sent in stalled] == [key]  # once
        assert stalled[0]["holder"] == holder.holder
        # Still wedged: the heartbeat itself declared the loss when the lease ran out.
        assert holder.wait_lost(SLACK)
    finally:
        unblock.set()
        thread.join(30)
    assert holder.lost
    assert len(stalled) == 1


def _keeps_the_key(
    backend: BaseBackend, key: str, seconds: float, every: float, **options: Any
) -> None:
    """A holder calling ``progress()`` every ``every`` seconds keeps ``key`` for ``seconds``."""
    service = TaskLockService(backend)
    stop = threading.Event()

    def work(held: Lock) -> None:
        while not stop.wait(every):
            held.progress()
            held.raise_if_lost()

    holder = service.lock(key, **options)
    thread, _ = hold_in_thread(holder, work)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            assert not service.lock(key).try_acquire(), "a contender took the key"
            assert not holder.lost
            time.sleep(0.5)
    finally:
        stop.set()
        thread.join(30)
    assert not holder.lost
    assert backend.peek(key) is None  # released by the holder, not run out


def test_a_holder_that_makes_progress_keeps_the_key(
    any_backend: ContractBackend, key: str, stalled: list[dict[str, Any]]
) -> None:
    _keeps_the_key(
        any_backend.backend,
        key,
        seconds=4,
        every=0.2,
        ttl=1,
        refresh_interval=0.2,
        progress_timeout=1,
    )
    assert stalled == []


@pytest.mark.slow
@pytest.mark.databases
def test_a_holder_calling_progress_every_second_runs_60_s_on_every_backend(
    stalled: list[dict[str, Any]],
) -> None:
    """The issue's figure: 60 s at one progress() a second, every backend at once."""
    backends: list[tuple[str, BaseBackend]] = [
        ("sqlite", database_backend("default").backend),
        ("memory", MemoryBackend()),
    ]
    for name in ("postgres", "mariadb"):
        require_service(name)
        backends.append((name, database_backend(name).backend))
    require_service("redis")
    redis = redis_backend("progress-60")
    backends.append(("redis", next(redis).backend))
    failures: list[str] = []

    def run(name: str, backend: BaseBackend) -> None:
        try:
            _keeps_the_key(
                backend,
                f"progress-60-{name}",
                seconds=60,
                every=1.0,
                ttl=3,
                refresh_interval=1,
                progress_timeout=3,
            )
        except BaseException as error:  # reported below, with the backend's name
            failures.append(f"{name}: {error!r}")
        finally:
            backend.close()

    threads = [threading.Thread(target=run, args=pair) for pair in backends]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    next(redis, None)  # its clean-up
    assert failures == []
    assert stalled == []


def test_progress_timeout_is_validated_and_has_no_project_default() -> None:
    service = TaskLockService(MemoryBackend())
    with pytest.raises(ValueError, match="progress_timeout"):
        service.lock("k", progress_timeout=0)
    with pytest.raises(TypeError, match="progress_timeout"):
        service.lock("k", progress_timeout="5")  # type: ignore[arg-type]
    assert service.lock("k", progress_timeout=2).progress_timeout == timedelta(seconds=2)
    assert service.lock("k").progress_timeout is None
    with (
        override_settings(TASKLOCK_DEFAULTS={"progress_timeout": 60}),
        pytest.raises(ImproperlyConfigured, match="progress_timeout"),
    ):
        LockOptions.resolve()


def test_progress_needs_the_lock_held() -> None:
    held = TaskLockService(MemoryBackend()).lock("k", progress_timeout=1)
    with pytest.raises(RuntimeError, match="not held"):
        held.progress()
    with held:
        held.progress()
    with pytest.raises(RuntimeError, match="not held"):
        held.progress()


def test_without_progress_timeout_a_silent_holder_keeps_the_key(
    stalled: list[dict[str, Any]],
) -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)
    with service.lock("quiet", ttl=0.5, refresh_interval=0.1) as held:
        time.sleep(1.5)  # three ttls without a word
        assert not service.lock("quiet").try_acquire()
        assert not held.lost
    assert stalled == []


@pytest.mark.databases
def test_progress_timeout_ends_with_the_work_not_with_the_callers_transaction(
    key: str, stalled: list[dict[str, Any]]
) -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)
    with transaction.atomic():
        options: Any = {"ttl": 0.5, "refresh_interval": 0.1, "progress_timeout": 0.3}
        assert service.run_exclusive(key, lambda: None, **options).acquired
        time.sleep(1.5)  # the release waits for the commit: the work is over, not stuck
        assert backend.peek(key) is not None
        assert stalled == []
    assert backend.peek(key) is None  # released at the commit
