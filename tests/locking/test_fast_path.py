"""What the fast path remembers follows the settings and the process."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

from django_tasklock.locking.options import DEFAULT_TTL, LockOptions


def test_remembered_options_follow_tasklock_defaults() -> None:
    assert LockOptions.resolve().ttl == DEFAULT_TTL
    with override_settings(TASKLOCK_DEFAULTS={"ttl": 60}):
        assert LockOptions.resolve().ttl == timedelta(seconds=60)
        assert LockOptions.resolve(ttl=30).refresh_interval == timedelta(seconds=10)
    assert LockOptions.resolve().ttl == DEFAULT_TTL
    assert LockOptions.resolve(ttl=30).refresh_interval == timedelta(seconds=10)


def test_remembered_options_never_take_true_for_one() -> None:
    assert LockOptions.resolve(ttl=1).ttl == timedelta(seconds=1)
    with pytest.raises(TypeError, match="ttl"):
        LockOptions.resolve(ttl=True)


def test_unhashable_options_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match="refresh_interval"):
        LockOptions.resolve(refresh_interval=[1])  # type: ignore[arg-type]


def test_a_loop_of_short_locks_does_not_wake_the_heartbeat_per_lock() -> None:
    import threading
    from unittest import mock

    from django_tasklock.api.service import TaskLockService
    from django_tasklock.backends.memory import MemoryBackend
    from django_tasklock.leases.heartbeat import heartbeat

    service = TaskLockService(MemoryBackend())
    service.run_exclusive("wake-up", lambda: None, ttl=60)  # the thread runs and settles
    threading.Event().wait(0.2)
    with mock.patch.object(heartbeat()._cond, "notify", wraps=heartbeat()._cond.notify) as woken:
        for n in range(200):
            assert service.run_exclusive(f"short-{n}", lambda: None, ttl=60).acquired
    assert woken.call_count <= 2


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_names_itself_in_its_tokens_holder_and_pid() -> None:
    import os

    from django_tasklock.api.service import TaskLockService
    from django_tasklock.backends.base import Holder
    from django_tasklock.backends.memory import MemoryBackend
    from django_tasklock.leases.tokens import new_token, this_pid, this_process

    parent = this_process()  # remembered in the parent first
    assert parent.pid == os.getpid() == this_pid()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        try:
            lock = TaskLockService(MemoryBackend()).lock("child").acquire()
            ours = os.getpid()
            ok = lock.holder == this_process() == Holder.from_token(new_token())
            lock.release()
            ok = ok and this_process().pid == ours == this_pid()
            os.write(write, b"ok" if ok else b"no")
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as answer:
        assert answer.read() == b"ok"
    assert this_process() == parent


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("thread_of", ["heartbeat", "watchdog"])
def test_a_thread_that_ended_is_started_again_by_the_next_lease(thread_of: str) -> None:
    import threading
    from unittest import mock

    from django_tasklock.backends.memory import MemoryBackend
    from django_tasklock.leases.heartbeat import Heartbeat
    from django_tasklock.leases.lease import Lease, clock
    from django_tasklock.leases.tokens import new_token, this_process
    from django_tasklock.leases.watchdog import DeadlineWatcher
    from django_tasklock.locking.options import LockOptions

    keeper = Heartbeat() if thread_of == "heartbeat" else DeadlineWatcher()
    loop = "_beat_forever" if thread_of == "heartbeat" else "_watch_forever"

    def lease(key: str) -> Lease:
        options = LockOptions.resolve(ttl=60)
        return Lease(MemoryBackend(), key, new_token(), this_process(), options, asked_at=clock())

    def end_at_once() -> None:
        raise SystemExit  # the thread ends, as it would if an error escaped its loop

    first, second = lease("first"), lease("second")
    with mock.patch.object(keeper, loop, end_at_once):
        keeper.add(first)
        ended = keeper._thread
        assert ended is not None
        ended.join(10)
    assert not ended.is_alive()
    # The loop started again waits to be let go: this test's private keeper leaves
    # no thread behind (a later test counts the heartbeat's threads by name).
    let_go = threading.Event()

    def wait_to_be_let_go() -> None:
        let_go.wait(60)

    with mock.patch.object(keeper, loop, wait_to_be_let_go):
        keeper.add(second)
        again = keeper._thread
        assert again is not ended
        assert isinstance(again, threading.Thread)
        assert again.is_alive()
        let_go.set()
        again.join(10)
    assert not again.is_alive()
    for done in (first, second):
        done.closed = True
    if isinstance(keeper, Heartbeat):
        keeper.remove(first)
        keeper.remove(second)


def test_a_lost_event_made_after_the_declaration_is_already_set() -> None:
    from django_tasklock.backends.memory import MemoryBackend
    from django_tasklock.leases.lease import Lease, clock
    from django_tasklock.leases.tokens import new_token, this_process
    from django_tasklock.locking.options import LockOptions

    def lease() -> Lease:
        options = LockOptions.resolve(ttl=60)
        return Lease(MemoryBackend(), "k", new_token(), this_process(), options, asked_at=clock())

    late, early = lease(), lease()
    assert late.mark_lost("taken")
    assert late.declared
    assert late.lost_event.is_set()  # made now, after the declaration
    waited_on = early.lost_event  # made before it
    assert not waited_on.is_set()
    assert not early.declared
    assert early.mark_lost("taken")
    assert waited_on.is_set()
    assert early.lost_event is waited_on


def test_a_plain_function_marked_as_a_coroutine_function_is_still_refused() -> None:
    from asgiref.sync import markcoroutinefunction

    from django_tasklock.api.service import TaskLockService
    from django_tasklock.backends.memory import MemoryBackend

    def plain() -> None:
        pass

    def marked() -> None:  # pragma: no cover - never called
        pass

    markcoroutinefunction(marked)  # what async-capable wrappers do
    service = TaskLockService(MemoryBackend())
    assert service.run_exclusive("k", plain).acquired
    with pytest.raises(TypeError, match="arun_exclusive"):
        service.run_exclusive("k", marked)


def test_a_locks_remembered_options_follow_the_settings_and_the_types() -> None:
    from django_tasklock.locking.lock import Lock

    assert Lock("k", ttl=60).options.refresh_interval == timedelta(seconds=20)
    with override_settings(TASKLOCK_DEFAULTS={"refresh_interval": 5}):
        assert Lock("k", ttl=60).options.refresh_interval == timedelta(seconds=5)
    assert Lock("k", ttl=60).options.refresh_interval == timedelta(seconds=20)
    assert Lock("k", ttl=1, fencing=True).fencing is True
    with pytest.raises(TypeError, match="fencing"):
        Lock("k", ttl=1, fencing=1)  # type: ignore[arg-type]  # equal to True, not a bool
    with pytest.raises(ValueError, match="key"):
        Lock("", ttl=1, fencing=True)  # the same options, remembered: the key is still checked
    with pytest.raises(TypeError, match="unexpected keyword argument 'tll'"):
        Lock("", tll=1)  # type: ignore[call-arg]  # named before the key, as always
