"""``@unique_on`` with django.tasks: two real ``db_worker`` processes (django-tasks-db).

Tasks wait in the test's SQLite database file; their keys live on PostgreSQL
or on Redis, shared by the workers and this process, which enqueues (and so
do the processes of the burst, ``tests.support.unique_runs``).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings

from django_tasklock.exceptions import AlreadyEnqueued
from tests.frameworks.test_unique_celery import BURST, burst_outcome, free, runs
from tests.jobs import BUILTIN_TASKS, wait_for
from tests.support import leader_runs, processes, unique_runs
from tests.support.leader_runs import wait_until

pytestmark = pytest.mark.databases


def worker_env(store: str) -> dict[str, str]:
    """The environment of a ``db_worker`` (or an enqueuing process) keeping keys in ``store``."""
    return {
        **leader_runs.lock_store(store),
        "DJANGO_SETTINGS_MODULE": "tests.jobs.lock_settings",
        "TASKLOCK_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
    }


@pytest.fixture(scope="module", params=["postgres", "redis"])
def workers(
    request: pytest.FixtureRequest,
    django_db_setup: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """Two ``db_worker`` processes keeping their keys in PostgreSQL or Redis (the param)."""
    if not BUILTIN_TASKS:
        processes.require_module("django_tasks")
    processes.require_module("django_tasks_db")
    store: str = request.param
    logs = tmp_path_factory.mktemp(f"db_worker-{store}")
    with ExitStack() as running:
        for name in ("first", "second"):
            running.enter_context(_db_worker(store, logs / f"{name}.log"))
        # A test that kills a worker starts its replacement here: the module's
        # tests run in any order, and some need two workers at once.
        _replace[store] = lambda name: running.enter_context(_db_worker(store, logs / name))
        try:
            yield store
        finally:
            del _replace[store]


#: Per store, while its workers run: start one more (given its log's name).
_replace: dict[str, Callable[[str], object]] = {}


def _db_worker(store: str, log: Path) -> AbstractContextManager[object]:
    args = ["django", "db_worker", "--backend=database", "--interval=0.1", "--no-startup-delay"]
    return processes.worker(args, worker_env(store), log)


@pytest.fixture
def tasks(workers: str) -> Iterator[Any]:
    """The tasks module, with this process keeping its keys where the workers do."""
    from tests.jobs import django_unique

    where = (
        {"TASKLOCK_DATABASE": "postgres"}
        if workers == "postgres"
        else {"TASKLOCK_BACKEND": "redis", "TASKLOCK_REDIS_URL": settings.REDIS_URL}
    )
    with override_settings(**where):
        yield django_unique


def finished(result: Any) -> str:
    """Wait for a task's end (the test's database is emptied after each test); its status."""
    wait_until(lambda: result.refresh() or result.is_finished, 30, f"task {result.id} unfinished")
    return str(result.status.name)


def test_a_burst_of_100_identical_enqueues_queues_one_and_it_runs_once(
    workers: str, tasks: Any, tmp_path: Path
) -> None:
    name = f"burst-{uuid.uuid4().hex[:8]}"
    queued = tasks.hold_unique.using(backend="database")
    # 4 processes of 25 threads, enqueueing at the same moment.
    reports = unique_runs.enqueue_at_once(
        worker_env(workers), "django-tasks", name, str(tmp_path), 4, BURST // 4
    )
    wait_for(tmp_path / f"{name}.holding")
    burst_outcome(reports, f"unique:{name}")
    with pytest.raises(AlreadyEnqueued):  # running, still unique
        queued.enqueue(name, str(tmp_path))
    (tmp_path / f"{name}.release").touch()
    wait_until(lambda: free(f"unique:{name}"), 30, "the key was not freed when the task ended")
    assert len(runs(tmp_path, name)) == 1
    sent = [task for report in reports for task in report["sent"]]
    assert finished(queued.get_result(sent[0])) == "SUCCESSFUL"
    again = queued.enqueue(name, str(tmp_path))  # free again: accepted, and it runs
    assert finished(again) == "SUCCESSFUL"
    assert len(runs(tmp_path, name)) == 2


def test_another_key_is_enqueued_alongside(tasks: Any, tmp_path: Path) -> None:
    queued = tasks.hold_unique.using(backend="database")
    one, two = f"one-{uuid.uuid4().hex[:8]}", f"two-{uuid.uuid4().hex[:8]}"
    first = queued.enqueue(one, str(tmp_path))
    second = queued.enqueue(two, str(tmp_path))
    wait_for(tmp_path / f"{one}.holding")
    wait_for(tmp_path / f"{two}.holding")
    (tmp_path / f"{one}.release").touch()
    (tmp_path / f"{two}.release").touch()
    assert (finished(first), finished(second)) == ("SUCCESSFUL", "SUCCESSFUL")


def test_a_failing_task_frees_its_key(tasks: Any, tmp_path: Path) -> None:
    name = f"fail-{uuid.uuid4().hex[:8]}"
    result = tasks.fail_unique.using(backend="database").enqueue(name, str(tmp_path))
    assert finished(result) == "FAILED"
    assert len(runs(tmp_path, name)) == 1
    assert free(f"unique:{name}")  # at once, where its ttl is 60 s


def test_the_immediate_backend_runs_it_at_once_and_frees_the_key(
    tasks: Any, tmp_path: Path
) -> None:
    name = f"now-{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.release").touch()
    result = tasks.hold_unique.enqueue(name, str(tmp_path))  # the "default" backend
    assert result.return_value == f"ran:{name}"
    assert free(f"unique:{name}")


def test_a_worker_killed_mid_task_frees_its_key_within_the_ttl(
    workers: str, tasks: Any, tmp_path: Path
) -> None:
    """The whole worker: a ``db_worker`` runs its tasks in its own process.

    The killed worker is replaced afterwards, for the module's other tests.
    """
    name = f"killed-{uuid.uuid4().hex[:8]}"
    queued = tasks.hold_briefly_keyed.using(backend="database")
    queued.enqueue(name, str(tmp_path))
    wait_for(tmp_path / f"{name}.holding")
    pid = int((tmp_path / f"{name}.holding").read_text())
    assert unique_runs.parent_of(pid) == os.getpid()  # a db_worker this test started
    time.sleep(1.5)  # held past its first refreshes: alive, the worker keeps it
    assert not free(f"unique:{name}")
    unique_runs.assert_freed_within_ttl(f"unique:{name}", 3, lambda: os.kill(pid, signal.SIGKILL))
    _replace[workers](f"replacing-{pid}.log")  # two workers again, for the other tests
    again = queued.enqueue(name, str(tmp_path))  # free: accepted, the other worker runs it
    (tmp_path / f"{name}.release").touch()
    assert finished(again) == "SUCCESSFUL"
    assert len(runs(tmp_path, name)) == 2
