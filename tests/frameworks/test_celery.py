"""@exclusive under Celery's @shared_task, run by a real ``celery worker`` (two pool processes).

The broker is RabbitMQ (``TASKLOCK_TEST_AMQP_URL``), results come back over it
(``rpc://``), and the lock lives in the test's SQLite database file, which the
worker's processes share.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from django_tasklock import TaskLockService
from django_tasklock.api.retrying import DEFAULT_BACKOFF
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.exceptions import RetryUnavailable
from tests.jobs import PATIENCE, wait_for
from tests.support import framework_runs, processes, rerun_runs, services

pytestmark = pytest.mark.databases

AMQP_ENV = "TASKLOCK_TEST_AMQP_URL"


def amqp_url() -> str:
    url = os.environ.get(AMQP_ENV)
    if not url:
        reason = (
            f"RabbitMQ not available: set {AMQP_ENV} (e.g. amqp://guest:guest@127.0.0.1:5672//)"
        )
        if services.IN_CI:
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    return url


@pytest.fixture(scope="module")
def celery_tasks(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The tasks module, with a prefork worker (two processes) serving a queue of its own."""
    processes.require_module("celery")
    url = amqp_url()
    queue = f"tasklock-tests-{uuid.uuid4().hex[:8]}"
    os.environ["TASKLOCK_TEST_AMQP_URL"] = url
    os.environ["TASKLOCK_TEST_CELERY_QUEUE"] = queue
    from tests.jobs import celery_tasks

    celery_tasks.app.conf.update(broker_url=url, task_default_queue=queue)
    assert celery_tasks.queue == queue
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.jobs.settings",
        "TASKLOCK_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
        "TASKLOCK_TEST_AMQP_URL": url,
        "TASKLOCK_TEST_CELERY_QUEUE": queue,
    }
    args = [
        "celery", "-A", "tests.jobs.celery_tasks", "worker", "--pool=prefork",
        "--concurrency=2", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--loglevel=WARNING", f"--hostname={queue}@%h",
    ]  # fmt: skip
    log = tmp_path_factory.mktemp("celery") / "worker.log"
    with processes.worker(args, env, log):
        assert celery_tasks.ping.delay().get(timeout=60) == "pong"
        yield celery_tasks
        celery_tasks.app.control.purge()


@pytest.fixture
def signals(tmp_path: Path) -> Path:
    return tmp_path


def test_overlapping_deliveries_of_one_key_run_once(celery_tasks: Any, signals: Path) -> None:
    first = celery_tasks.hold_key.delay("same", "first", str(signals))
    wait_for(signals / "first.holding")
    second = celery_tasks.hold_key.delay("same", "second", str(signals))
    assert second.get(timeout=60) is None  # skipped while "first" holds the key
    assert not (signals / "second.holding").exists()
    (signals / "first.release").touch()
    assert first.get(timeout=60) == "ran:first"


def test_different_keys_run_at_the_same_time(celery_tasks: Any, signals: Path) -> None:
    one = celery_tasks.hold_key.delay("one", "one", str(signals))
    two = celery_tasks.hold_key.delay("two", "two", str(signals))
    # Both hold their keys at once: neither waited for the other.
    wait_for(signals / "one.holding")
    wait_for(signals / "two.holding")
    (signals / "one.release").touch()
    (signals / "two.release").touch()
    assert (one.get(timeout=60), two.get(timeout=60)) == ("ran:one", "ran:two")


def test_two_worker_processes_fifty_overlapping_tasks_of_one_key_never_overlap(
    celery_tasks: Any, signals: Path
) -> None:
    results = [celery_tasks.record.delay("volume", str(signals), 0.05) for _ in range(50)]
    runs = framework_runs.await_runs(signals, 50)
    framework_runs.assert_one_at_a_time(runs, 50)  # the workers: the pool's two processes
    assert sorted(result.get(timeout=60) for result in results) == sorted(
        ["ran"] * len(runs.ran_by) + ["skipped"] * len(runs.skipped_by)
    )


def test_after_release_the_key_runs_again(celery_tasks: Any, signals: Path) -> None:
    (signals / "again.release").touch()
    assert celery_tasks.hold_key.delay("again", "again", str(signals)).get(timeout=60) == (
        "ran:again"
    )
    assert celery_tasks.hold_key.delay("again", "again", str(signals)).get(timeout=60) == (
        "ran:again"
    )


def test_a_lost_lock_becomes_a_retry(celery_tasks: Any, signals: Path) -> None:
    result = celery_tasks.retry_when_lost.delay("lost", "lost", str(signals))
    wait_for(signals / "lost.0.holding")
    # An operator's force release: the worker's heartbeat finds the lease gone,
    # the next checkpoint() raises LockLost, and the task asks to be retried.
    assert DatabaseBackend(using="default").force_release("celery:lost")
    wait_for(signals / "lost.1.holding")  # the retry holds the key again
    (signals / "lost.release").touch()
    assert result.get(timeout=60) == "ran:lost:attempt 1"


def test_twenty_triggers_during_a_run_make_exactly_one_more_run(
    celery_tasks: Any, tmp_path: Path
) -> None:
    # The holder occupies one pool process; the 20 triggers need the other. The
    # prefork pool's default ("fair") scheduling hands a task only to an idle
    # process, and with a prefetch multiplier of 1 the worker reserves at most one
    # message per process: no trigger is queued behind the holder on its process.
    worker = f"{celery_tasks.queue}@{socket.gethostname()}"  # the fixture's --hostname
    stats = celery_tasks.app.control.inspect([worker], timeout=30).stats()[worker]
    assert stats["pool"]["max-concurrency"] >= 2
    assert celery_tasks.app.conf.worker_prefetch_multiplier == 1
    key = f"rerun-{tmp_path.name}"
    sent: list[Any] = []
    rerun_runs.twenty_triggers(
        lambda n: sent.append(celery_tasks.rebuild.delay(key, str(tmp_path), n)),
        tmp_path,
        sent_again=True,
    )
    assert [result.get(timeout=60) for result in sent] == [None] * (rerun_runs.TRIGGERS + 1)


def await_retries(folder: Path, count: int) -> list[int]:
    """The tries that asked for a retry (``framework_runs.retries``), once there are ``count``."""
    deadline = time.monotonic() + PATIENCE
    while len(tries := framework_runs.retries(folder)) < count:
        assert time.monotonic() < deadline, f"{len(tries)} of {count} retries"
        time.sleep(0.05)
    return tries


def test_a_task_whose_key_is_held_is_retried_until_it_is_free_then_runs_once(
    celery_tasks: Any, signals: Path
) -> None:
    key = f"retry-{signals.name}"
    with TaskLockService().lock(f"celery:{key}", ttl=60):
        result = celery_tasks.retried.delay(key, str(signals))
        assert await_retries(signals, 1)[0] == 1  # try 1 found the key held
        time.sleep(0.5)  # let the next try start, so that the pending countdown is a later one
        tries = framework_runs.retries(signals)
        releasing = time.time()
    released = time.time()
    assert result.get(timeout=120) == "ran"
    runs = framework_runs.read_runs(signals)
    assert len(runs.intervals) == 1, runs  # exactly one run
    entry = runs.intervals[0][0]
    assert entry >= releasing  # never beside the holder
    # The try pending at the release was asked for by try len(tries) (or, had one more
    # found the key held just before the release, the next): its countdown is at most
    # 2 ** (n - 1) s (capped); then 30 s of slack for a loaded machine.
    pending = min(DEFAULT_BACKOFF.most, 2 ** len(tries))
    assert entry - released <= pending + 30, (entry - released, tries)
    assert tries == list(range(1, len(tries) + 1))  # each try counted once, in order
    assert framework_runs.retries(signals) in (tries, [*tries, len(tries) + 1])


def test_a_celery_task_called_as_a_function_is_no_run_to_retry(
    celery_tasks: Any, tmp_path: Path
) -> None:
    """``task()`` in this process (``request.called_directly``): no worker to retry it.

    Here, with the module's fixture: importing ``tests.jobs.celery_tasks`` before
    the fixture set its queue would leave the module on the default queue.
    """
    key = f"direct-{tmp_path.name}"
    with (
        TaskLockService().lock(f"celery:{key}", ttl=60),
        pytest.raises(RetryUnavailable, match="on_locked='rerun'"),
    ):
        celery_tasks.retried(key, str(tmp_path))
    assert celery_tasks.retried(key, str(tmp_path)) == "ran"  # the key free
