"""The service's own rules: options, defaults, tokens, the heartbeat thread."""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_tasklock import Holder, TaskLockService
from django_tasklock.api.service import new_token
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.leases.heartbeat import heartbeat
from django_tasklock.locking.options import LockOptions


def test_defaults_are_15_minutes_a_third_and_24_hours() -> None:
    options = LockOptions.resolve()
    assert options.ttl == timedelta(minutes=15)
    assert options.refresh_interval == timedelta(minutes=5)
    assert options.max_lifetime == timedelta(hours=24)


def test_refresh_interval_follows_a_short_ttl() -> None:
    assert LockOptions.resolve(ttl=10).refresh_interval == timedelta(seconds=10 / 3)


def test_seconds_and_timedeltas_are_equal() -> None:
    assert LockOptions.resolve(ttl=90.0, refresh_interval=30) == LockOptions.resolve(
        ttl=timedelta(seconds=90), refresh_interval=timedelta(seconds=30)
    )


def test_project_defaults_apply_and_calls_override_them() -> None:
    with override_settings(TASKLOCK_DEFAULTS={"ttl": 60, "max_lifetime": timedelta(hours=2)}):
        options = LockOptions.resolve()
        assert (options.ttl, options.refresh_interval, options.max_lifetime) == (
            timedelta(seconds=60),
            timedelta(seconds=20),
            timedelta(hours=2),
        )
        assert LockOptions.resolve(ttl=30).ttl == timedelta(seconds=30)


def test_invalid_project_default_is_named_as_the_setting() -> None:
    with (
        override_settings(TASKLOCK_DEFAULTS={"ttl": -5}),
        pytest.raises(ImproperlyConfigured, match=r"TASKLOCK_DEFAULTS\['ttl'\]"),
    ):
        LockOptions.resolve()


def test_token_is_unguessable_and_names_host_and_pid() -> None:
    token = new_token()
    host, pid, secret = token.rsplit(":", 2)
    assert (host, int(pid)) == (socket.gethostname(), os.getpid())
    assert len(secret) >= 22  # at least 128 bits from secrets
    assert Holder.from_token(token) == Holder(socket.gethostname(), os.getpid())


def test_holder_of_a_foreign_value() -> None:
    assert Holder.from_token("garbage") == Holder("?", None)
    assert str(Holder("?", None)) == "?:?"


def test_heartbeat_thread_is_a_daemon() -> None:
    service = TaskLockService(MemoryBackend())
    service.run_exclusive("daemon", lambda: None)
    threads = [t for t in threading.enumerate() if t.name == "django-tasklock-heartbeat"]
    assert len(threads) == 1
    assert threads[0].daemon
    assert heartbeat()._thread is threads[0]


def test_heartbeat_does_not_refresh_work_that_ends_before_the_first_tick() -> None:
    from django_tasklock.testing import FaultyBackend

    faulty = FaultyBackend(MemoryBackend())
    TaskLockService(faulty).run_exclusive("quick", lambda: None, ttl=0.3)
    threading.Event().wait(0.4)
    assert faulty.refresh_calls == 0


def test_peek_validates_the_key_and_reports_the_holder() -> None:
    service = TaskLockService(MemoryBackend())
    with pytest.raises(ValueError, match="key"):
        service.peek("")
    seen = service.run_exclusive("peeked", lambda: service.peek("peeked"))
    assert seen.result is not None
    assert seen.result.holder == Holder(socket.gethostname(), os.getpid())
    assert service.peek("peeked") is None


def test_failing_signal_receivers_never_break_the_lock(caplog: pytest.LogCaptureFixture) -> None:
    from django_tasklock import lock_acquired, lock_lost, lock_released

    def broken(**kwargs: object) -> None:
        raise RuntimeError("receiver bug")

    backend = MemoryBackend()
    service = TaskLockService(backend)
    for signal in (lock_acquired, lock_released, lock_lost):
        signal.connect(broken)
    try:
        # A lease lost (and its broken receiver run) on the heartbeat thread...
        lost = service.run_exclusive(
            "loses",
            lambda: (backend.force_release("loses"), threading.Event().wait(1.2)),
            ttl=1,
            refresh_interval=0.1,
        )
        # ...leaves the heartbeat alive for the next one, which outlives its ttl twice
        # (a ttl of 3 s: with one of 1 s, a CI run's heartbeat thread, on a machine loaded
        # by four test workers, once went a whole second without a turn).
        kept = service.run_exclusive(
            "kept", lambda: threading.Event().wait(6.5), ttl=3, refresh_interval=0.1
        )
    finally:
        for signal in (lock_acquired, lock_released, lock_lost):
            signal.disconnect(broken)
    assert lost.acquired
    assert lost.lost
    assert kept.acquired
    assert not kept.lost
    assert backend.list() == []
    assert "receiver bug" in caplog.text


def test_a_failing_receiver_is_logged_with_one_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from django_tasklock import lock_acquired

    def broken(**kwargs: object) -> None:
        raise RuntimeError("receiver bug")

    lock_acquired.connect(broken)
    try:
        with caplog.at_level(logging.DEBUG):
            assert TaskLockService(MemoryBackend()).run_exclusive("logged", lambda: 1).acquired
    finally:
        lock_acquired.disconnect(broken)
    failures = [r for r in caplog.records if "receiver bug" in r.getMessage() or r.exc_info]
    assert sum(1 for r in failures if r.exc_info) == 1  # Django's, on django.dispatch
    ours = [r for r in failures if r.name == "django_tasklock"]
    assert len(ours) == 1
    assert "'logged'" in ours[0].getMessage()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_gets_a_heartbeat_of_its_own() -> None:
    # Celery's prefork pool forks workers from a parent that may hold leases.
    import multiprocessing

    parent = TaskLockService(MemoryBackend())
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()

    def child() -> None:
        result = TaskLockService(MemoryBackend()).run_exclusive(
            "child", lambda: threading.Event().wait(2.5), ttl=1, refresh_interval=0.1
        )
        results.put(result.lost)

    def fork_while_holding() -> None:
        process = ctx.Process(target=child)
        process.start()
        process.join(30)

    # ttls of 1 s, outlived twice or more: on a loaded machine one tick can come 0.3 s late.
    held = parent.run_exclusive("parent", fork_while_holding, ttl=1, refresh_interval=0.1)
    assert results.get(timeout=30) is False  # the child's lease was kept alive
    assert not held.lost


def test_lease_that_could_not_be_refreshed_past_its_end_is_reported_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from django_tasklock.testing import FaultyBackend

    faulty = FaultyBackend(MemoryBackend(), refresh_failures=1000, release_fails=True)
    result = TaskLockService(faulty).run_exclusive(
        "unconfirmed", lambda: threading.Event().wait(0.7), ttl=0.3, refresh_interval=0.1
    )
    assert result.acquired
    assert result.lost  # nothing confirmed the lease after its ttl ran out
    assert "was lost (expired)" in caplog.text


def test_heartbeat_outlives_a_receiver_that_raises_system_exit() -> None:
    from django_tasklock import lock_lost

    def exits(**kwargs: object) -> None:
        raise SystemExit(3)

    backend = MemoryBackend()
    service = TaskLockService(backend)
    lock_lost.connect(exits)
    try:
        service.run_exclusive(
            "exit-on-lost",
            lambda: (backend.force_release("exit-on-lost"), threading.Event().wait(0.4)),
            ttl=0.3,
            refresh_interval=0.1,
        )
    finally:
        lock_lost.disconnect(exits)
    kept = service.run_exclusive(
        "after-exit", lambda: threading.Event().wait(0.6), ttl=0.3, refresh_interval=0.1
    )
    assert not kept.lost


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_never_releases_its_parents_lease() -> None:
    from django.conf import settings

    from tests.conftest import require_service

    require_service("redis")
    from django_tasklock.backends.redis import RedisBackend

    backend = RedisBackend(url=settings.REDIS_URL)
    service = TaskLockService(backend)
    lock = service.lock("forked", ttl=30).acquire()
    try:
        pid = os.fork()
        if pid == 0:  # the child leaves the work as a with block's exit would
            lock.release()
            os._exit(0)
        os.waitpid(pid, 0)
        held = backend.peek("forked")
        assert held is not None
        assert held.holder.pid == os.getpid()
    finally:
        lock.release()
    assert backend.peek("forked") is None


def test_many_short_locks_do_not_pile_up_in_the_heartbeat() -> None:
    service = TaskLockService(MemoryBackend())
    done = threading.Event()
    # A long job keeps the heartbeat asleep until its first refresh...
    holder = threading.Thread(target=service.run_exclusive, args=("long", done.wait))
    holder.start()
    try:
        threading.Event().wait(0.2)
        # ...while short jobs come and go, each due for a refresh only later.
        for n in range(2000):
            service.run_exclusive(f"short-{n}", lambda: None, ttl=900)
        assert len(heartbeat()._heap) <= 200
    finally:
        done.set()
        holder.join()


class _InterruptedAfterAcquiring(MemoryBackend):
    """The storage grants the lease, then Ctrl-C arrives before the caller knows."""

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        assert super().acquire(key, token, ttl=ttl, max_lifetime=max_lifetime)
        raise KeyboardInterrupt


def test_interrupt_right_after_the_lease_was_granted_releases_it() -> None:
    backend = _InterruptedAfterAcquiring()
    ran: list[bool] = []
    with pytest.raises(KeyboardInterrupt):
        TaskLockService(backend).run_exclusive("granted", lambda: ran.append(True))
    assert ran == []
    assert backend.peek("granted") is None


def test_interrupt_between_leaving_the_heartbeat_and_the_release_releases() -> None:
    from unittest import mock

    from django_tasklock.leases.heartbeat import Heartbeat

    backend = MemoryBackend()
    leave = Heartbeat.remove

    def remove_then_interrupt(self: Heartbeat, lease: object, **kwargs: bool) -> None:
        leave(self, lease, **kwargs)  # type: ignore[arg-type]
        raise KeyboardInterrupt

    with (
        mock.patch.object(Heartbeat, "remove", remove_then_interrupt),
        pytest.raises(KeyboardInterrupt),
    ):
        TaskLockService(backend).run_exclusive("leaving", lambda: None)
    assert backend.peek("leaving") is None


def test_lease_whose_ttl_passed_during_a_suspend_is_lost_not_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # time.monotonic() stops while Linux is suspended; CLOCK_BOOTTIME does not.
    # The clock is the one thing mocked: a suspend cannot be caused for real.
    import time
    from unittest import mock

    from django_tasklock.testing import FaultyBackend

    if not hasattr(time, "CLOCK_BOOTTIME"):
        pytest.skip("no CLOCK_BOOTTIME here: monotonic is the lease clock")
    real, slept = time.clock_gettime, [0.0]

    def clock_gettime(clock_id: int) -> float:
        return real(clock_id) + (slept[0] if clock_id == time.CLOCK_BOOTTIME else 0.0)

    def work() -> None:
        slept[0] = 60.0  # the machine slept for a minute, longer than the ttl
        threading.Event().wait(0.6)

    faulty = FaultyBackend(MemoryBackend(), refresh_failures=1000)
    with mock.patch("time.clock_gettime", clock_gettime):
        result = TaskLockService(faulty).run_exclusive(
            "suspended", work, ttl=5, refresh_interval=0.2
        )
    assert result.lost
    assert "retrying" not in caplog.text
