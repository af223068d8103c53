"""LeaderScheduler in this process: who ticks, what a new leader does to the schedule.

The real thing (three ``celery beat`` processes, a kill -9) is test_beat_leader.py.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import django
import pytest
from django.test import override_settings

from django_tasklock.contrib.checks import check_integrations
from tests.support import processes

pytestmark = pytest.mark.databases


@pytest.fixture
def app() -> Any:
    processes.require_module("celery")
    from celery import Celery

    app = Celery("leader-tests", broker="memory://", set_as_current=False)
    app.conf.update(
        beat_schedule={
            "hourly": {"task": "tests.hourly", "schedule": timedelta(hours=1)},
        },
        tasklock_beat_key=f"beat-{uuid.uuid4().hex[:8]}",
        tasklock_beat_ttl=5,
        tasklock_beat_retry_interval=0.25,
    )
    return app


@pytest.fixture
def make(app: Any, tmp_path: Path) -> Iterator[Any]:
    from django_tasklock.contrib.celery import LeaderScheduler

    made: list[Any] = []

    def make(name: str) -> Any:
        scheduler = LeaderScheduler(app=app, schedule_filename=str(tmp_path / name))
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        scheduler.close()


def test_one_scheduler_leads_the_others_wait_the_retry_interval(make: Any) -> None:
    first, second = make("first"), make("second")
    first.tick()
    assert first.leadership.is_leader
    assert second.tick() == 0.25  # a standby looks again after retry_interval
    assert not second.leadership.is_leader
    assert "tasklock: one active beat, elected by 'beat-" in first.info
    assert "(ttl 5 s)" in second.info


def test_a_new_leader_counts_every_entry_as_run_when_it_took_over(make: Any) -> None:
    first, second = make("first"), make("second")
    first.tick()
    second.tick()
    stale = second.schedule["hourly"].last_run_at - timedelta(days=1)
    second.schedule["hourly"].last_run_at = stale  # as if its schedule file were old
    first.close()  # lets go: the standby leads at its next look
    second.tick()
    since = second.leadership.leader_since
    assert since is not None
    assert second.schedule["hourly"].last_run_at >= since  # not due for another hour


def test_the_same_term_does_not_move_the_schedule_again(make: Any) -> None:
    first = make("first")
    first.tick()
    moved = first.schedule["hourly"].last_run_at
    first.tick()
    assert first.schedule["hourly"].last_run_at == moved


def test_a_force_released_leader_fires_nothing_once_a_standby_took_over(make: Any) -> None:
    # Before: the old leader's tick trusted its lease until the heartbeat's next
    # refresh (ttl / 3), and fired every tick due meanwhile, as the new one did.
    from django_tasklock.backends import get_backend

    first, second = make("first"), make("second")
    first.tick()
    assert get_backend().force_release(first.leadership.key) is not None
    second.tick()
    assert second.leadership.is_leader
    assert first.tick() == 0.25  # a standby now: it fired nothing
    assert not first.leadership.is_leader
    assert second.leadership.is_leader


def test_a_leader_never_sleeps_through_the_window_in_which_it_renews_its_term(
    make: Any,
) -> None:
    # A term is renewed at a poll in its last ttl before the 24 h cap. Before,
    # the leader slept as long as Celery said (beat_max_interval, 300 s, with
    # nothing due for an hour), mostly past that ttl-wide window (5 s here):
    # the lease reached its cap, was declared lost and a standby took over.
    first = make("first")
    interval = first.tick()
    assert first.leadership.is_leader
    assert 0 < interval <= first.leadership.ttl.total_seconds() / 2


def test_the_standby_defaults_follow_the_leadership_defaults(app: Any, tmp_path: Path) -> None:
    from django_tasklock.contrib.celery import LeaderScheduler

    del app.conf["tasklock_beat_key"], app.conf["tasklock_beat_ttl"]
    scheduler = LeaderScheduler(app=app, schedule_filename=str(tmp_path / "s"), lazy=True)
    assert scheduler.leadership.key == "celery-beat:leader-tests"
    assert scheduler.leadership.ttl == timedelta(seconds=30)


@pytest.mark.parametrize(
    ("setting", "message"),
    [("tasklock_beat_ttl", "ttl must be positive"), ("tasklock_beat_retry_interval", "retry")],
)
def test_a_zero_setting_is_refused_naming_it(
    app: Any, tmp_path: Path, setting: str, message: str
) -> None:
    # Before: 0 was taken for "unset", and the default (30 s, 1 s) used silently.
    from django_tasklock.contrib.celery import LeaderScheduler

    app.conf[setting] = 0
    with pytest.raises(ValueError, match=f"tasklock_beat_.*{message}"):
        LeaderScheduler(app=app, schedule_filename=str(tmp_path / "s"), lazy=True)


def test_check_names_the_extra_when_celery_is_missing_for_the_scheduler_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_tasklock.contrib import INTEGRATIONS, Integration

    monkeypatch.setitem(
        INTEGRATIONS,
        "celery",
        Integration("tasklock_no_celery_here", "celery", "celery", versions=">=5.3"),
    )
    with override_settings(CELERY_BEAT_SCHEDULER="django_tasklock.contrib.celery:LeaderScheduler"):
        (error,) = check_integrations()
    assert error.id == "django_tasklock.E020"
    assert "CELERY_BEAT_SCHEDULER" in error.msg
    assert "pip install 'celery>=5.3'" in error.msg


def test_database_scheduler_moves_the_rows_of_its_schedule_when_it_takes_over(
    tmp_path: Path,
) -> None:
    if django.VERSION >= (6, 1) and importlib.util.find_spec("django_celery_beat") is None:
        pytest.skip("django-celery-beat (2.9) does not support Django 6.1 yet")
    processes.require_module("django_celery_beat")
    env = {
        **os.environ,
        "PYTHONPATH": str(processes.ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.jobs.beat_db_settings",
        "TASKLOCK_TEST_SQLITE": str(tmp_path / "beat.sqlite3"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.jobs.beat_database"],
        cwd=processes.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "ok"
