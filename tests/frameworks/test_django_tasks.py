"""@exclusive under the @task of Django's Tasks framework.

``django.tasks`` on Django >= 6.0, the django-tasks backport before. The
immediate backend runs the task in the test; the database backend of
django-tasks-db is served by two real ``manage.py db_worker`` processes
sharing the test's SQLite database file, which also holds the locks.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django
import pytest
from django.db import connections

from django_tasklock import TaskLockService
from tests.jobs import BUILTIN_TASKS, PATIENCE, wait_for
from tests.support import framework_runs, processes, rerun_runs

pytestmark = pytest.mark.databases


@pytest.fixture(scope="module")
def tasks() -> Any:
    """The module of tasks (needs the framework and django-tasks-db installed)."""
    if not BUILTIN_TASKS:
        processes.require_module("django_tasks")
    processes.require_module("django_tasks_db")
    from tests.jobs import django_tasks

    return django_tasks


@pytest.fixture(scope="module")
def db_workers(
    tasks: Any, django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Two ``db_worker`` processes serving the ``database`` task backend."""
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.jobs.settings",
        "TASKLOCK_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
    }
    args = ["django", "db_worker", "--backend=database", "--interval=0.1", "--no-startup-delay"]
    logs = tmp_path_factory.mktemp("db_worker")
    with (
        processes.worker(args, env, logs / "first.log"),
        processes.worker(args, env, logs / "second.log"),
    ):
        yield


def outcome(result: Any) -> Any:
    """The return value of a task result once its worker is done with it."""
    deadline = time.monotonic() + PATIENCE
    while not result.is_finished:
        assert time.monotonic() < deadline, f"task {result.id} still {result.status}"
        time.sleep(0.05)
        result.refresh()
    assert result.status.name == "SUCCESSFUL", result.errors
    return result.return_value


def test_the_task_and_its_backends_are_django_tasks_from_django_6_and_the_backport_before(
    tasks: Any,
) -> None:
    name = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    framework = importlib.import_module(name)
    base = importlib.import_module(f"{name}.backends.base").BaseTaskBackend
    assert type(tasks.hold_key).__module__.startswith(f"{name}.")
    assert isinstance(framework.task_backends["default"], base)
    assert isinstance(framework.task_backends["database"], base)


def test_immediate_backend_runs_the_task_when_the_key_is_free(tasks: Any, tmp_path: Path) -> None:
    (tmp_path / "now.release").touch()
    result = tasks.hold_key.enqueue("free", "now", str(tmp_path))
    assert result.return_value == "ran:now"


def test_immediate_backend_skips_the_task_while_the_key_is_held(
    tasks: Any, tmp_path: Path
) -> None:
    with TaskLockService().lock("django-task:busy", ttl=60):
        result = tasks.hold_key.enqueue("busy", "now", str(tmp_path))
    assert result.status.name == "SUCCESSFUL"
    assert result.return_value is None
    assert not (tmp_path / "now.holding").exists()


@pytest.mark.usefixtures("db_workers")
def test_db_workers_run_one_of_two_overlapping_tasks_of_one_key(
    tasks: Any, tmp_path: Path
) -> None:
    queued = tasks.hold_key.using(backend="database")
    first = queued.enqueue("same", "first", str(tmp_path))
    wait_for(tmp_path / "first.holding")
    second = queued.enqueue("same", "second", str(tmp_path))
    assert outcome(second) is None  # the other worker skipped it
    assert not (tmp_path / "second.holding").exists()
    (tmp_path / "first.release").touch()
    assert outcome(first) == "ran:first"


@pytest.mark.usefixtures("db_workers")
def test_db_workers_run_tasks_of_different_keys_at_once(tasks: Any, tmp_path: Path) -> None:
    queued = tasks.hold_key.using(backend="database")
    one = queued.enqueue("one", "one", str(tmp_path))
    two = queued.enqueue("two", "two", str(tmp_path))
    wait_for(tmp_path / "one.holding")
    wait_for(tmp_path / "two.holding")
    (tmp_path / "one.release").touch()
    (tmp_path / "two.release").touch()
    assert (outcome(one), outcome(two)) == ("ran:one", "ran:two")


@pytest.mark.usefixtures("db_workers")
def test_two_db_workers_fifty_overlapping_tasks_of_one_key_never_overlap(
    tasks: Any, tmp_path: Path
) -> None:
    queued = tasks.record.using(backend="database")
    results = [queued.enqueue("volume", str(tmp_path), 0.05) for _ in range(50)]
    runs = framework_runs.await_runs(tmp_path, 50)
    framework_runs.assert_one_at_a_time(runs, 50)
    assert sorted(outcome(result) for result in results) == sorted(
        ["ran"] * len(runs.ran_by) + ["skipped"] * len(runs.skipped_by)
    )


@pytest.mark.usefixtures("db_workers")
def test_db_workers_twenty_triggers_during_a_run_make_exactly_one_more_run(
    tasks: Any, tmp_path: Path
) -> None:
    queued = tasks.rebuild.using(backend="database")
    key = f"rerun-{tmp_path.name}"
    rerun_runs.twenty_triggers(
        lambda n: queued.enqueue(key, str(tmp_path), n), tmp_path, sent_again=True
    )
