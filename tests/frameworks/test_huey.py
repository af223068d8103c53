"""Huey: ``django_tasklock.contrib.huey.lock_task`` under real ``run_huey`` consumers.

Two djhuey consumers (``manage.py run_huey``, one worker thread each) serve a
queue of this run's own on the shared Redis server (``TASKLOCK_TEST_REDIS_URL``);
the locks live in the test's SQLite database file, which the consumers share.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from django_tasklock import current_lock, lock, lock_skipped
from tests.jobs import await_lines, wait_for
from tests.support import processes, rerun_runs, services
from tests.support.volume_workers import overlaps

pytestmark = pytest.mark.databases

TIMEOUT = 60


def redis_url() -> str:
    """The Redis server of ``TASKLOCK_TEST_REDIS_URL`` (or a container); under CI=true,
    settings already failed without one."""
    url: str | None = settings.REDIS_URL
    if not url:
        pytest.skip(services.missing.get("redis", "Redis not available"))
    return url


@contextlib.contextmanager
def consumers(count: int, logs: Path, *options: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` ``run_huey`` consumers (one worker thread each) serving this run's queue,
    with ``options`` for ``run_huey``.

    Stopped at the block's end, and the queue, schedule and results emptied.
    """
    processes.require_module("huey")
    url = redis_url()
    from huey.contrib.djhuey import HUEY

    env = {
        "DJANGO_SETTINGS_MODULE": "tests.jobs.huey_settings",
        "TASKLOCK_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
        "TASKLOCK_TEST_REDIS_URL": url,
        "TASKLOCK_TEST_HUEY_NAME": HUEY.name,
    }
    # -n: no periodic tasks to schedule; -k thread -w 1: one worker each.
    args = ["django", "run_huey", "-w", "1", "-k", "thread", "-n", "--delay", "0.1", *options]
    try:
        with contextlib.ExitStack() as stack:
            yield [
                stack.enter_context(processes.worker(args, env, logs / f"consumer-{n}.log"))
                for n in range(count)
            ]
    finally:
        HUEY.flush()  # this run's queue, schedule and results; nobody else's


@pytest.fixture(scope="module")
def huey_tasks(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The tasks module, with two consumers serving this run's queue."""
    with consumers(2, tmp_path_factory.mktemp("huey")):
        from tests.jobs.huey_app import tasks

        yield tasks


def outcome(result: Any) -> Any:
    """A task's return value, or ``"locked"`` when it ended with ``TaskLockedException``."""
    from huey.exceptions import TaskException

    try:
        return result.get(blocking=True, timeout=TIMEOUT)
    except TaskException as exc:
        error = exc.metadata["error"]
    assert "TaskLockedException" in error, error
    return "locked"


def test_overlapping_tasks_of_one_key_run_once(huey_tasks: Any, tmp_path: Path) -> None:
    first = huey_tasks.hold_key(str(tmp_path), "same", "first")
    wait_for(tmp_path / "first.holding")
    second = huey_tasks.hold_key(str(tmp_path), "same", "second")
    assert outcome(second) == "locked"  # the other consumer did not run it...
    assert not (tmp_path / "second.holding").exists()
    wait_for(tmp_path / f"{second.id}.locked")  # ...and Huey sent SIGNAL_LOCKED
    (tmp_path / "first.release").touch()
    assert outcome(first) == "ran:first"
    assert not (tmp_path / f"{first.id}.locked").exists()


def test_different_keys_run_at_the_same_time(huey_tasks: Any, tmp_path: Path) -> None:
    one = huey_tasks.hold_key(str(tmp_path), "one", "one")
    two = huey_tasks.hold_key(str(tmp_path), "two", "two")
    # Both hold their keys at once, one on each consumer: neither waited for the other.
    wait_for(tmp_path / "one.holding")
    wait_for(tmp_path / "two.holding")
    (tmp_path / "one.release").touch()
    (tmp_path / "two.release").touch()
    assert (outcome(one), outcome(two)) == ("ran:one", "ran:two")


def test_a_held_lock_sends_signal_locked_and_the_task_is_retried(
    huey_tasks: Any, tmp_path: Path
) -> None:
    with lock(huey_tasks.RETRIED_KEY, ttl=60):
        result = huey_tasks.retried(str(tmp_path), "job")
        wait_for(tmp_path / f"{result.id}.locked")  # the first try found the key held
        assert not (tmp_path / "job.ran").exists()
    # retries=5, retry_delay=1: Huey runs it again, and now the key is free.
    assert outcome(result) == "ran:job"


def test_on_locked_retry_has_huey_retry_the_task_until_the_key_is_free(
    huey_tasks: Any, tmp_path: Path
) -> None:
    """The core's ``@exclusive(..., on_locked="retry")`` in a Huey task: the consumer
    knows the task by ``install(HUEY)``'s hooks; ``RetryTask(delay=...)`` requeues
    it while the key is held; it runs once, after the release; its counter goes."""
    from huey.contrib.djhuey import HUEY

    with lock(huey_tasks.lock_name("core-retry"), ttl=60):
        result = huey_tasks.retry_when_held(str(tmp_path), "core-retry", "job")
        await_lines(tmp_path / "job.tries", 2)  # retried at least once
        assert not (tmp_path / "job.runs").exists()
        released = time.time()
    assert outcome(result) == "ran:job"
    time.sleep(1)  # room for a second run, which must not come
    (ran,) = (tmp_path / "job.runs").read_text().split()
    assert float(ran) >= released
    counter = f"django-tasklock:tries:{result.id}"
    wait_until(lambda: HUEY.storage.conn.hget(HUEY.storage.counter_key, counter) is None)


def test_two_consumers_fifty_overlapping_tasks_never_overlap(
    huey_tasks: Any, tmp_path: Path
) -> None:
    results = [huey_tasks.record_interval(str(tmp_path), 0.05) for _ in range(50)]
    outcomes = [outcome(result) for result in results]
    intervals = [tuple(value) for value in outcomes if value != "locked"]
    locked = outcomes.count("locked")
    assert intervals, "no task ran"
    assert overlaps(intervals) == []
    assert locked, "the two consumers never contended: the test proved nothing"
    # Huey sent SIGNAL_LOCKED for each task that did not run.
    assert len(list(tmp_path.glob("*.locked"))) == locked


def test_two_consumers_twenty_triggers_during_a_run_make_exactly_one_more_run(
    huey_tasks: Any, tmp_path: Path
) -> None:
    """The holder takes one consumer's only worker; the other consumer skips the 20. The
    tasks are known by install(HUEY)'s hooks (huey_app): the holder enqueues the last
    skipped task's call once more, on its own Huey, for either consumer."""
    key = f"rerun-{tmp_path.name}"
    rerun_runs.twenty_triggers(
        lambda n: huey_tasks.rebuild(str(tmp_path), key, n), tmp_path, sent_again=True
    )


# -- in the test process: the drop-in's own surface ----------------------------


def test_run_huey_flush_locks_ends_the_leases_of_its_lock_names(
    django_db_setup: None, tmp_path: Path
) -> None:
    """``run_huey --flush-locks --extra-locks NAME``, on a Huey that ``install`` gave our
    ``flush_locks`` (tests/jobs/huey_app/apps.py): the remedy Huey documents for a lock
    left by a consumer that is gone ends the leases of the decorators' lock names
    and of the names given, before the consumer serves its queue."""
    from django_tasklock.backends.database import DatabaseBackend
    from django_tasklock.leases.tokens import new_token
    from django_tasklock.testing.support import LIFE
    from tests.jobs.huey_app.tasks import RETRIED_KEY, VOLUME_KEY, lock_name

    backend = DatabaseBackend(using="default")  # the consumers' storage: this SQLite file
    long = timedelta(minutes=15)  # not over before a consumer starts on a loaded machine
    left = lock_name("left-behind")
    for name in (RETRIED_KEY, left):  # as a consumer that died holding them left them
        assert backend.acquire(name, new_token(), ttl=long, max_lifetime=LIFE)
    kept = lock_name("not-named")
    assert backend.acquire(kept, new_token(), ttl=long, max_lifetime=LIFE)
    try:
        with consumers(1, tmp_path, "--flush-locks", "--extra-locks", left) as [consumer]:
            log = tmp_path / "consumer-0.log"
            # Logged once every lease is ended, before the consumer serves its queue.
            wait_until(
                lambda: "Found stale locks" in log.read_text() or consumer.poll() is not None
            )
            assert consumer.poll() is None, log.read_text()
            flushed = log.read_text().split("Found stale locks", 1)[1].splitlines()[0]
            assert RETRIED_KEY in flushed, flushed
            assert left in flushed, flushed
            assert VOLUME_KEY not in flushed  # registered, but nobody held it
            assert backend.peek(left) is None
            assert backend.peek(RETRIED_KEY) is None
            assert backend.peek(kept) is not None  # a name neither given nor used there
    finally:
        for name in (RETRIED_KEY, left, kept):
            backend.force_release(name)


def test_install_is_hueys_methods_on_the_instance(contrib: Any, key: str) -> None:
    from huey import MemoryHuey
    from huey.exceptions import TaskLockedException

    huey = MemoryHuey("tasklock-install")
    contrib.install(huey)
    with huey.lock_task(key, 60) as held:
        assert held.is_locked()
        assert held.locked()
        assert huey.is_locked(key)
        assert held.key == key
        assert not held.lost
        with pytest.raises(TaskLockedException):
            huey.lock_task(key).acquire()
    assert not huey.is_locked(key)
    with lock(key, ttl=60, refresh_interval=0.1) as other:  # a holder still running
        assert huey.flush_locks() >= {key}
        wait_until(lambda: other.lost)
    assert huey.flush_locks(key, "", " ", "x" * 300) == set()  # --extra-locks "a,,b", no lock
    contrib.install(huey)  # again: its flush_locks calls Huey's own, not the first install's
    assert huey._tasklock_flush_locks.__func__ is type(huey).flush_locks
    huey.put_if_empty(f"{huey.name}.lock.own", "1")
    assert huey.flush_locks("own") == {"own"}


def far() -> Any:
    """A moment after every retry's eta (the consumer's clock, in a test)."""
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) + timedelta(hours=1)


def test_track_tasks_lets_on_locked_retry_retry_the_running_task(contrib: Any, key: str) -> None:
    """In this process, a Huey instance's consumer loop by hand: ``track_tasks``
    hooks; a held key requeues the task with a delay; the key free, it runs,
    and its counter of tries is gone."""
    from huey import MemoryHuey

    from django_tasklock import TaskLockService, exclusive
    from django_tasklock.api.retrying import RetryBackoff
    from django_tasklock.backends.memory import MemoryBackend
    from django_tasklock.contrib import retries

    huey = MemoryHuey("tasklock-retry")
    contrib.track_tasks(huey)
    service = TaskLockService(MemoryBackend())

    @huey.task()  # type: ignore[untyped-decorator]
    @exclusive(key, on_locked="retry", service=service)
    def job() -> str:
        return "ran"

    result = job()
    task = huey.dequeue()
    with service.lock(key):
        huey.execute(task)  # try 1: held
    assert huey.storage.incr(contrib.tries_key(task), 0) == 1
    (again,) = huey.read_schedule(far())
    assert again.id == task.id
    assert again.retries == 0  # RetryTask leaves the task's own retries alone
    huey.execute(again, far())  # try 2: free
    assert result.get() == "ran"
    assert huey.storage.incr(contrib.tries_key(task), 0) == 0  # deleted by the post hook
    assert retries.huey(RetryBackoff()) is None  # no task runs now


def test_the_last_try_of_a_huey_task_ends_as_skipped(contrib: Any, key: str) -> None:
    from huey import MemoryHuey

    from django_tasklock import TaskLockService, exclusive
    from django_tasklock.api.retrying import RetryBackoff
    from django_tasklock.backends.memory import MemoryBackend

    huey = MemoryHuey("tasklock-retry-last")
    contrib.track_tasks(huey)
    service = TaskLockService(MemoryBackend())

    @huey.task()  # type: ignore[untyped-decorator]
    @exclusive(key, on_locked="retry", service=service)
    def job() -> str:
        return "ran"  # pragma: no cover - never runs: the key is held

    result = job()
    task = huey.dequeue()
    tries = 1
    with service.lock(key):
        huey.execute(task)
        while scheduled := huey.read_schedule(far()):
            (task,) = scheduled
            huey.execute(task, far())
            tries += 1
    assert tries == RetryBackoff().tries
    assert result.get() is None  # the last try: skipped
    assert huey.storage.incr(contrib.tries_key(task), 0) == 0


def test_outside_a_task_the_huey_retrier_knows_none(contrib: Any) -> None:
    from django_tasklock.api.retrying import RetryBackoff
    from django_tasklock.contrib import retries

    assert retries.huey(RetryBackoff()) is None


def test_install_takes_a_huey(contrib: Any) -> None:
    with pytest.raises(TypeError, match="huey must be a Huey instance, not str"):
        contrib.install("HUEY")


@pytest.fixture
def contrib() -> Any:
    processes.require_module("huey")
    from django_tasklock.contrib import huey

    return huey


def test_the_context_manager_raises_hueys_exception_while_held(contrib: Any, key: str) -> None:
    from huey.exceptions import TaskLockedException

    skipped: list[str] = []

    def note(key: str, **kwargs: Any) -> None:
        skipped.append(key)

    lock_skipped.connect(note)
    try:
        with (
            lock(key, ttl=60),
            pytest.raises(TaskLockedException, match=f"unable to acquire lock {key}$"),
            contrib.lock_task(key),
        ):
            pytest.fail("ran while the key was held")
    finally:
        lock_skipped.disconnect(note)
    assert skipped == [key]
    with contrib.lock_task(key, 60) as held:  # ttl positional, as Huey's
        assert held.key == key
        assert current_lock() is held
        assert contrib.lock_task(key).is_locked()
    assert not contrib.lock_task(key).is_locked()


def test_called_as_hueys_own_with_lock_name_by_keyword(contrib: Any, key: str) -> None:
    """Huey's is ``huey.lock_task(lock_name, ttl=None)`` (djhuey's ``lock_task`` is it):
    a project that names the argument keeps working."""
    with contrib.lock_task(lock_name=key, ttl=60) as held:
        assert held.key == key
    with pytest.raises(ValueError, match="lock_name must not be empty"):
        contrib.lock_task(lock_name="")


def test_the_decorator_runs_when_free_and_raises_when_held(contrib: Any, key: str) -> None:
    from huey.exceptions import TaskLockedException

    from django_tasklock.contrib.huey import lock_task

    @lock_task(key, ttl=60)
    def work(value: int) -> int:
        """Doubles."""
        assert current_lock() is not None
        return value * 2

    assert work(21) == 42
    assert work.__doc__ == "Doubles."
    with lock(key, ttl=60), pytest.raises(TaskLockedException):
        work(1)


def test_acquire_release_and_clear_as_hueys(contrib: Any, key: str) -> None:
    from huey.exceptions import TaskLockedException

    task_lock = contrib.lock_task(key, ttl=60)
    assert task_lock.acquire() is True
    with pytest.raises(TaskLockedException):
        contrib.lock_task(key).acquire()
    task_lock.release()
    assert not task_lock.locked()
    with pytest.raises(RuntimeError, match="not held by this thread"):
        task_lock.release()
    # clear() ends whoever holds the key, as Huey's deletes its key.
    with lock(key, ttl=60, refresh_interval=0.1) as other:
        assert task_lock.clear() is True
        assert not task_lock.is_locked()
        wait_until(lambda: other.lost)
    assert task_lock.clear() is False


def wait_until(condition: Any, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        (("",), {}, ValueError, "name must not be empty"),
        ((42,), {}, TypeError, "name must be a str"),
        (("k", 0), {}, ValueError, "ttl"),
        (("k",), {"refresh_interval": 120, "ttl": 60}, ValueError, "refresh_interval"),
        (("k",), {"colour": "red"}, TypeError, "colour"),
        (("k",), {"cancel_on_loss": True}, TypeError, "cancel_on_loss"),
        (("k",), {"limit": 2}, TypeError, "limit"),
        (("k",), {"on_lost": "explode"}, ValueError, "on_lost"),
    ],
)
def test_bad_input_names_the_parameter(
    contrib: Any, args: tuple[Any, ...], kwargs: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        contrib.lock_task(*args, **kwargs)


def test_above_a_huey_task_is_a_type_error(contrib: Any, key: str) -> None:
    from huey import MemoryHuey

    huey = MemoryHuey("tasklock-order-check")

    def work() -> None: ...

    with pytest.raises(TypeError, match=r"put @huey\.task\(\) .* above @lock_task"):
        contrib.lock_task(key)(huey.task()(work))
