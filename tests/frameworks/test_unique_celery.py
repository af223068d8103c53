"""``unique_on=`` with real Celery workers (RabbitMQ), keys on PostgreSQL and on Redis.

A prefork worker (two processes) serves a queue of the test's; the test
process enqueues, with the same lock storage as the worker, and so do the
processes of the burst (``tests.support.unique_runs``).
"""

from __future__ import annotations

import functools
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings
from kombu.entity import Exchange, Queue

from django_tasklock.backends import get_backend
from django_tasklock.exceptions import AlreadyEnqueued
from tests.frameworks.test_celery import amqp_url
from tests.jobs import wait_for
from tests.support import leader_runs, processes, unique_runs
from tests.support.leader_runs import wait_until

pytestmark = pytest.mark.databases

#: Identical enqueues at once in the burst tests.
BURST = 100


@pytest.fixture(scope="module")
def celery_unique() -> Iterator[Any]:
    """The tasks module, sending to a queue of this test module's (deleted at its end)."""
    processes.require_module("celery")
    url = amqp_url()
    os.environ["TASKLOCK_TEST_CELERY_QUEUE"] = f"tasklock-unique-tests-{uuid.uuid4().hex[:8]}"
    from tests.jobs import celery_unique

    celery_unique.app.conf.update(broker_url=url)
    yield celery_unique
    with celery_unique.app.connection_for_write() as connection:
        Queue(celery_unique.queue)(connection.default_channel).delete()


def worker_env(store: str, module: Any, queue: str | None = None) -> dict[str, str]:
    """The environment of a worker (or an enqueuing process) keeping its keys in ``store``."""
    return {
        **leader_runs.lock_store(store),
        "DJANGO_SETTINGS_MODULE": "tests.jobs.lock_settings",
        "TASKLOCK_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
        "TASKLOCK_TEST_AMQP_URL": module.app.conf.broker_url,
        "TASKLOCK_TEST_CELERY_QUEUE": queue or module.queue,
    }


def worker_args(queue: str) -> list[str]:
    """A prefork worker of two processes serving ``queue``."""
    return [
        "celery", "-A", "tests.jobs.celery_unique", "worker", "--pool=prefork",
        "--concurrency=2", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--loglevel=INFO", f"--hostname={queue}@%h",
    ]  # fmt: skip


@pytest.fixture(scope="module", params=["postgres", "redis"])
def worker(
    request: pytest.FixtureRequest,
    celery_unique: Any,
    django_db_setup: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, Any]]:
    """(store, the tasks module), with a prefork worker keeping its keys in that store."""
    store: str = request.param
    env = worker_env(store, celery_unique)
    log = tmp_path_factory.mktemp("celery-unique") / f"worker-{store}.log"
    with processes.worker(worker_args(celery_unique.queue), env, log):
        answering(celery_unique.app, celery_unique.queue)
        yield store, celery_unique
        celery_unique.app.control.purge()  # nothing left for the next store's worker


def answering(app: Any, queue: str) -> None:
    """Wait until the worker serving ``queue`` answers a ping: its control queue is consumed.

    A broadcast sent before then (``revoke()``) reaches no queue and is lost,
    and a test run first, or alone, would wait for a revoke that never came.
    """
    name = f"{queue}@"

    def answered() -> bool:
        replies = app.control.ping(timeout=0.5)
        return any(node.startswith(name) for reply in replies for node in reply)

    wait_until(answered, 60, f"the worker serving {queue} did not answer a ping")


@pytest.fixture
def tasks(worker: tuple[str, Any]) -> Iterator[Any]:
    """The tasks module, with this process keeping its keys where the worker does."""
    store, module = worker
    where = (
        {"TASKLOCK_DATABASE": "postgres"}
        if store == "postgres"
        else {"TASKLOCK_BACKEND": "redis", "TASKLOCK_REDIS_URL": settings.REDIS_URL}
    )
    with override_settings(**where):
        yield module


def runs(signals: Path, name: str) -> list[str]:
    path = signals / f"{name}.runs"
    return path.read_text().split() if path.exists() else []


def free(key: str) -> bool:
    return get_backend().peek(key) is None


def burst_outcome(reports: list[dict[str, Any]], key: str) -> None:
    """One of the burst's enqueues was accepted; every other was refused naming its lease."""
    assert [error for report in reports for error in report["errors"]] == []
    sent = [task for report in reports for task in report["sent"]]
    refused = [lease for report in reports for lease in report["refused"]]
    assert (len(sent), len(refused)) == (1, BURST - 1)
    held = get_backend().peek(key)
    assert held is not None
    assert set(refused) == {held.lease}  # the lease of the one enqueued: none named nobody


def test_a_burst_of_100_identical_enqueues_sends_one_and_it_runs_once(
    worker: tuple[str, Any], tasks: Any, tmp_path: Path
) -> None:
    name = f"burst-{uuid.uuid4().hex[:8]}"
    env = worker_env(worker[0], tasks)
    # 4 processes of 25 threads, enqueueing at the same moment.
    reports = unique_runs.enqueue_at_once(env, "celery", name, str(tmp_path), 4, BURST // 4)
    wait_for(tmp_path / f"{name}.holding")
    burst_outcome(reports, f"unique:{name}")
    with pytest.raises(AlreadyEnqueued):  # running, still unique
        tasks.hold_unique.delay(name, str(tmp_path))
    (tmp_path / f"{name}.release").touch()
    wait_until(lambda: free(f"unique:{name}"), 30, "the key was not freed when the task ended")
    assert len(runs(tmp_path, name)) == 1
    # Free again: the next enqueue is accepted and runs.
    tasks.hold_unique.delay(name, str(tmp_path))
    wait_until(lambda: len(runs(tmp_path, name)) == 2, 30, "the next task did not run")


def test_another_key_is_enqueued_alongside(tasks: Any, tmp_path: Path) -> None:
    one, two = f"one-{uuid.uuid4().hex[:8]}", f"two-{uuid.uuid4().hex[:8]}"
    tasks.hold_unique.delay(one, str(tmp_path))
    tasks.hold_unique.delay(two, str(tmp_path))
    wait_for(tmp_path / f"{one}.holding")
    wait_for(tmp_path / f"{two}.holding")
    (tmp_path / f"{one}.release").touch()
    (tmp_path / f"{two}.release").touch()


def test_a_failing_task_frees_its_key(tasks: Any, tmp_path: Path) -> None:
    name = f"fail-{uuid.uuid4().hex[:8]}"
    tasks.fail_unique.delay(name, str(tmp_path))
    wait_until(lambda: len(runs(tmp_path, name)) == 1, 30, "the task did not run")
    wait_until(lambda: free(f"unique:{name}"), 10, "a failed task kept its key")  # ttl is 60 s


def test_a_revoked_task_frees_its_key(tasks: Any, tmp_path: Path) -> None:
    name = f"revoke-{uuid.uuid4().hex[:8]}"
    result = tasks.hold_unique.apply_async((name, str(tmp_path)), countdown=2)
    assert not free(f"unique:{name}")
    result.revoke()
    # Discarded when due (in 2 s), well before the key's 60 s ttl.
    wait_until(lambda: free(f"unique:{name}"), 20, "a revoked task kept its key")
    assert runs(tmp_path, name) == []


def test_a_worker_process_killed_mid_task_frees_its_key_within_the_ttl(
    tasks: Any, tmp_path: Path
) -> None:
    """A pool process killed (its worker's main process lives on and replaces it)."""
    name = f"killed-{uuid.uuid4().hex[:8]}"
    tasks.hold_briefly_keyed.delay(name, str(tmp_path))
    wait_for(tmp_path / f"{name}.holding")
    time.sleep(1.5)  # held past its first refreshes: alive, the worker keeps it
    assert not free(f"unique:{name}")
    pid = int((tmp_path / f"{name}.holding").read_text())
    unique_runs.assert_freed_within_ttl(f"unique:{name}", 3, lambda: os.kill(pid, signal.SIGKILL))
    tasks.hold_briefly_keyed.delay(name, str(tmp_path))  # free: accepted
    wait_until(lambda: len(runs(tmp_path, name)) == 2, 30, "the next task did not run")
    (tmp_path / f"{name}.release").touch()


def test_a_whole_worker_killed_mid_task_frees_its_key_within_the_ttl(
    worker: tuple[str, Any], tasks: Any, tmp_path: Path
) -> None:
    """The worker's main process and its pool processes, all killed at once.

    A worker of its own, on a queue of its own: the module's worker lives on.
    """
    name = f"whole-{uuid.uuid4().hex[:8]}"
    own = f"{tasks.queue}-doomed-{uuid.uuid4().hex[:4]}"
    # As the doomed worker declares it (tests.jobs.celery_unique under its queue).
    queue = Queue(own, Exchange(own, type="direct"), routing_key=own, durable=False)
    env = worker_env(worker[0], tasks, own)
    try:
        with processes.worker(worker_args(own), env, tmp_path / "doomed.log") as doomed:
            tasks.hold_briefly_keyed.apply_async((name, str(tmp_path)), queue=queue)
            wait_for(tmp_path / f"{name}.holding")
            child = int((tmp_path / f"{name}.holding").read_text())
            assert unique_runs.parent_of(child) == doomed.pid  # in a pool process of it
            time.sleep(1.5)  # held past its first refreshes: alive, the worker keeps it
            assert not free(f"unique:{name}")
            # The worker runs in a process group of its own: the whole worker.
            kill = functools.partial(os.killpg, doomed.pid, signal.SIGKILL)
            unique_runs.assert_freed_within_ttl(f"unique:{name}", 3, kill)
            assert doomed.wait(timeout=30) == -signal.SIGKILL
            gone = "the pool process outlived the kill"
            wait_until(lambda: unique_runs.parent_of(child) is None, 30, gone)
    finally:
        with tasks.app.connection_for_write() as connection:
            queue(connection.default_channel).delete()
            queue.exchange(connection.default_channel).delete()
    tasks.hold_briefly_keyed.delay(name, str(tmp_path))  # free: accepted, by the other worker
    wait_until(lambda: len(runs(tmp_path, name)) == 2, 30, "the next task did not run")
    (tmp_path / f"{name}.release").touch()


def test_a_retry_carries_the_key_it_was_sent_with(tasks: Any, tmp_path: Path) -> None:
    name = f"retry-{uuid.uuid4().hex[:8]}"
    tasks.retry_unique.delay(name, str(tmp_path))
    wait_until(lambda: len(runs(tmp_path, name)) == 2, 30, "the retry did not run")
    wait_until(lambda: free(f"unique:{name}"), 10, "the retried task kept its key")


def test_a_retry_that_starts_before_its_first_attempt_ended_keeps_the_key(
    tasks: Any, tmp_path: Path
) -> None:
    # The retry carries the first attempt's token. Before: the retry, started
    # in the other worker process while the first attempt was still ending,
    # took the lease over by that token, and the first attempt's release then
    # deleted it: the key was free while the retry ran, and an identical task
    # was accepted and ran alongside it.
    name = f"retry-slowly-{uuid.uuid4().hex[:8]}"
    tasks.retry_slowly.delay(name, str(tmp_path))
    wait_for(tmp_path / f"{name}.holding")  # the retry runs, and holds
    wait_until(lambda: len(runs(tmp_path, name)) == 2, 30, "the retry did not run")
    time.sleep(2)  # the first attempt has ended by now (0.5 s after the retry began)
    try:
        assert not free(f"unique:{name}")
        with pytest.raises(AlreadyEnqueued):
            tasks.retry_slowly.delay(name, str(tmp_path))
    finally:
        (tmp_path / f"{name}.release").touch()
    wait_until(lambda: free(f"unique:{name}"), 10, "the retry kept its key")
