"""``unique_on=`` with real Celery workers (RabbitMQ), keys on PostgreSQL and on Redis.

A prefork worker (two processes) serves a queue of the test's; the test
process enqueues, with the same lock storage as the worker.
"""

from __future__ import annotations

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
from kombu.entity import Queue

from django_tasklock.backends import get_backend
from django_tasklock.exceptions import AlreadyEnqueued
from tests import leader_runs, processes
from tests.jobs import wait_for
from tests.leader_runs import wait_until
from tests.test_celery import amqp_url

pytestmark = pytest.mark.databases


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


@pytest.fixture(scope="module", params=["postgres", "redis"])
def worker(
    request: pytest.FixtureRequest,
    celery_unique: Any,
    django_db_setup: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, Any]]:
    """(store, the tasks module), with a prefork worker keeping its keys in that store."""
    store: str = request.param
    queue = celery_unique.queue
    url = celery_unique.app.conf.broker_url
    env = {
        **leader_runs.lock_store(store),
        "DJANGO_SETTINGS_MODULE": "tests.jobs.lock_settings",
        "TASKLOCK_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
        "TASKLOCK_TEST_AMQP_URL": url,
        "TASKLOCK_TEST_CELERY_QUEUE": queue,
    }
    args = [
        "celery", "-A", "tests.jobs.celery_unique", "worker", "--pool=prefork",
        "--concurrency=2", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--loglevel=INFO", f"--hostname={queue}@%h",
    ]  # fmt: skip
    log = tmp_path_factory.mktemp("celery-unique") / f"worker-{store}.log"
    with processes.worker(args, env, log):
        yield store, celery_unique
        celery_unique.app.control.purge()  # nothing left for the next store's worker


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


def test_a_burst_of_100_identical_enqueues_sends_one_and_it_runs_once(
    tasks: Any, tmp_path: Path
) -> None:
    name = f"burst-{uuid.uuid4().hex[:8]}"
    sent, refused = [], 0
    for _ in range(100):
        try:
            sent.append(tasks.hold_unique.delay(name, str(tmp_path)))
        except AlreadyEnqueued as exc:
            refused += exc.key == f"unique:{name}"
    assert (len(sent), refused) == (1, 99)
    wait_for(tmp_path / f"{name}.holding")
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
    name = f"killed-{uuid.uuid4().hex[:8]}"
    tasks.hold_briefly_keyed.delay(name, str(tmp_path))
    wait_for(tmp_path / f"{name}.holding")
    time.sleep(1.5)  # held past its first refreshes: alive, the worker keeps it
    assert not free(f"unique:{name}")
    os.kill(int((tmp_path / f"{name}.holding").read_text()), signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: free(f"unique:{name}"), 3 + 5, "the dead worker's key outlived its ttl")
    assert time.monotonic() - killed <= 3 + 5  # unique_ttl, plus room for a loaded machine
    tasks.hold_briefly_keyed.delay(name, str(tmp_path))  # free: accepted
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
