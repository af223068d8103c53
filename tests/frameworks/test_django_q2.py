"""``@exclusive`` on functions django-q2 schedules, run by a real ``qcluster`` (two workers).

The cluster uses the ORM broker on this run's PostgreSQL test database, which
also holds the schedules, the results and the locks. A cluster runs
django-q2's scheduler (``django_q.scheduler.scheduler``) every 30 s; the test
runs that same function itself when it wants due schedules turned into tasks,
so that it need not wait, and the cluster's own is off.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from tests.jobs import PATIENCE, wait_for
from tests.support import framework_runs, processes, rerun_runs, services

pytestmark = pytest.mark.databases

FUNC = "tests.jobs.q2_tasks"


class ToPostgres:
    """In the test process, django-q2's models live on the "postgres" alias (the cluster's)."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return "postgres" if model._meta.app_label == "django_q" else None

    db_for_write = db_for_read


@pytest.fixture(scope="module")
def schedules(
    django_db_setup: None,
    django_db_blocker: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Any]:
    """django-q2's ``Schedule`` rows (on the "postgres" alias), served by a cluster."""
    log = tmp_path_factory.mktemp("qcluster") / "qcluster.log"
    with cluster(django_db_blocker, log) as rows:
        yield rows


@contextlib.contextmanager
def cluster(django_db_blocker: Any, log: Path, **env: str) -> Iterator[Any]:
    """django-q2's ``Schedule`` rows, served by a ``qcluster`` (``env``: more of its own)."""
    processes.require_module("django_q")
    if "postgres" not in settings.DATABASES:
        reason = f"PostgreSQL not available: set {services.POSTGRES_ENV}"
        if services.IN_CI:
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    from django.contrib import admin
    from django.core.management import call_command

    # Installing django_q runs every app's ready() again: the admin's autodiscovery
    # then registers django_q's models on the admin site, where they would outlive
    # the override (the admin index of a later test in this process failed on the
    # app it no longer finds).
    registered = dict(admin.site._registry)
    with (
        # Read when django_q is first imported (as the app is installed): the test's
        # scheduler sends tasks to the cluster's queue, on the "postgres" alias.
        override_settings(
            Q_CLUSTER={"name": "tasklock-tests", "orm": "postgres", "timeout": 90, "retry": 120}
        ),
        override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, "django_q"]),
        override_settings(DATABASE_ROUTERS=[f"{__name__}.ToPostgres"]),
    ):
        from django_q.models import Schedule

        with django_db_blocker.unblock():
            call_command("migrate", "django_q", database="postgres", verbosity=0)
        env = {
            "DJANGO_SETTINGS_MODULE": "tests.jobs.q2_settings",
            "TASKLOCK_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
            "TASKLOCK_TEST_Q2_DATABASE": str(connections["postgres"].settings_dict["NAME"]),
            **env,
        }
        try:
            with processes.worker(["django", "qcluster"], env, log):
                yield Schedule.objects
        finally:
            admin.site._registry.clear()
            admin.site._registry.update(registered)


def fire() -> None:
    """One pass of django-q2's scheduler: a task for each schedule that is due."""
    from django_q.scheduler import scheduler

    scheduler()


def due_now(schedules: Any, name: str, func: str, *args: Any) -> Any:
    """A schedule that runs ``func(*args)`` once, due now."""
    return schedules.create(
        name=name,
        func=f"{FUNC}.{func}",
        args=repr(args),
        schedule_type="O",
        repeats=-1,
        next_run=timezone.now() - timedelta(seconds=1),
    )


def results(group: str, count: int) -> list[Any]:
    """The results of the tasks of a schedule (its name is their group), once ``count`` are."""
    from django_q.models import Task

    deadline = time.monotonic() + PATIENCE
    while len(tasks := list(Task.objects.filter(group=group))) < count:
        assert time.monotonic() < deadline, f"{len(tasks)} of {count} tasks of {group} done"
        time.sleep(0.1)
    assert all(task.success for task in tasks), [task.result for task in tasks]
    return [task.result for task in tasks]


def test_a_schedule_firing_while_its_last_run_still_runs_is_skipped(
    schedules: Any, tmp_path: Path
) -> None:
    # django-q2#96: a schedule every minute whose run takes longer. Ten minutes
    # behind (catch_up), it is due at each scheduler pass.
    schedules.create(
        name="every-minute",
        func=f"{FUNC}.hold_key",
        args=repr(("every-minute", "run", str(tmp_path))),
        schedule_type="I",
        minutes=1,
        repeats=-1,
        next_run=timezone.now() - timedelta(minutes=10),
    )
    fire()
    wait_for(tmp_path / "run.holding")
    fire()  # the schedule row is free again: a second task, while the first still runs
    fire()
    assert results("every-minute", 2) == [None, None]  # both skipped by the other worker
    schedules.filter(name="every-minute").delete()
    (tmp_path / "run.release").touch()
    assert sorted(results("every-minute", 3), key=str) == [None, None, "ran:run"]


def test_scheduled_tasks_of_different_keys_run_at_the_same_time(
    schedules: Any, tmp_path: Path
) -> None:
    due_now(schedules, "one", "hold_key", "one", "one", str(tmp_path))
    due_now(schedules, "two", "hold_key", "two", "two", str(tmp_path))
    fire()
    # Both hold their keys at once, in the cluster's two workers.
    wait_for(tmp_path / "one.holding")
    wait_for(tmp_path / "two.holding")
    (tmp_path / "one.release").touch()
    (tmp_path / "two.release").touch()
    assert results("one", 1) + results("two", 1) == ["ran:one", "ran:two"]


def test_fifty_scheduled_tasks_of_one_key_on_two_workers_never_overlap(
    schedules: Any, tmp_path: Path
) -> None:
    for number in range(50):
        due_now(schedules, f"volume-{number}", "record", "volume", 0.05, str(tmp_path))
    fire()
    runs = framework_runs.await_runs(tmp_path, 50)
    framework_runs.assert_one_at_a_time(runs, 50)
    # django-q2 records each as a successful task, with on_locked's value when skipped.
    outcomes = [results(f"volume-{number}", 1)[0] for number in range(50)]
    assert sorted(outcomes) == sorted(
        ["ran"] * len(runs.ran_by) + ["skipped"] * len(runs.skipped_by)
    )


def test_twenty_triggers_during_a_run_make_exactly_one_more_run(
    schedules: Any, tmp_path: Path
) -> None:
    # Each trigger is a task queued on the cluster's broker; the holder occupies one
    # of its two workers, the other takes the triggers.
    from django_q.tasks import async_task

    key = f"rerun-{tmp_path.name}"
    rerun_runs.twenty_triggers(
        lambda n: async_task(f"{FUNC}.rebuild", key, str(tmp_path), n, group=key),
        tmp_path,
        sent_again=True,
    )
    # The 21 sent, and the last skipped one's call sent again (in its group).
    assert results(key, rerun_runs.TRIGGERS + 2) == [None] * (rerun_runs.TRIGGERS + 2)
