"""django-cron: ``DJANGO_CRON_LOCK_BACKEND = "django_tasklock.contrib.django_cron.TaskLock"``.

Real ``manage.py runcrons`` processes (``python -m django runcrons``, settings
tests/jobs/cron_settings.py) run the jobs of tests/jobs/cron_jobs.py; the
locks and django-cron's tables live in the test's SQLite database file, which
the processes share.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections
from django.test import override_settings

from django_tasklock import TaskLockService, current_lock, lock
from django_tasklock.contrib import INTEGRATIONS, Integration
from django_tasklock.contrib.checks import check_integrations
from tests.jobs import PATIENCE, wait_for
from tests.support import processes
from tests.support.volume_workers import overlaps

pytestmark = pytest.mark.databases

BACKEND = "django_tasklock.contrib.django_cron.TaskLock"
JOBS = "tests.jobs.cron_jobs"


@pytest.fixture(scope="module")
def cron_env(django_db_setup: None) -> dict[str, str]:
    """The runners' environment, once django-cron's tables are in the test's database file."""
    processes.require_module("django_cron")
    env = {
        **os.environ,
        "PYTHONPATH": str(processes.ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.jobs.cron_settings",
        "TASKLOCK_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
    }
    migrate = [sys.executable, "-m", "django", "migrate", "django_cron", "--verbosity=0"]
    subprocess.run(migrate, cwd=processes.ROOT, env=env, check=True, timeout=PATIENCE)
    return env


def runcrons(env: dict[str, str], job: str, cron_class: str, signals: Path) -> str:
    """One ``manage.py runcrons --force <cron_class>`` to its end; its output."""
    done = subprocess.run(
        [sys.executable, "-m", "django", "runcrons", f"{JOBS}.{cron_class}", "--force"],
        cwd=processes.ROOT,
        env={**env, "TASKLOCK_TEST_JOB": job, "TASKLOCK_TEST_SIGNALS": str(signals)},
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        check=True,
    )
    return done.stdout + done.stderr


def started(env: dict[str, str], job: str, cron_class: str, signals: Path) -> Any:
    """A ``runcrons`` running in the background (stopped, if still there, at the block's end)."""
    return processes.worker(
        ["django", "runcrons", f"{JOBS}.{cron_class}", "--force"],
        {**env, "TASKLOCK_TEST_JOB": job, "TASKLOCK_TEST_SIGNALS": str(signals)},
        signals / f"{job}.log",
    )


def finished(process: subprocess.Popen[bytes], log: Path) -> str:
    assert process.wait(timeout=PATIENCE) == 0
    return log.read_text()


def test_overlapping_runcrons_run_the_job_once(cron_env: dict[str, str], tmp_path: Path) -> None:
    with started(cron_env, "first", "HoldOne", tmp_path) as first:
        wait_for(tmp_path / "first.holding")
        output = runcrons(cron_env, "second", "HoldOne", tmp_path)
        assert "task lock 'django-cron:tasklock-tests.one' is held by host" in output
        assert "Will try later." in output
        assert not (tmp_path / "second.holding").exists()
        (tmp_path / "first.release").touch()
        assert "[✔] tasklock-tests.one" in finished(first, tmp_path / "first.log")


def test_different_jobs_run_at_the_same_time(cron_env: dict[str, str], tmp_path: Path) -> None:
    with (
        started(cron_env, "one", "HoldOne", tmp_path) as one,
        started(cron_env, "two", "HoldTwo", tmp_path) as two,
    ):
        wait_for(tmp_path / "one.holding")
        wait_for(tmp_path / "two.holding")
        (tmp_path / "one.release").touch()
        (tmp_path / "two.release").touch()
        assert "[✔] tasklock-tests.one" in finished(one, tmp_path / "one.log")
        assert "[✔] tasklock-tests.two" in finished(two, tmp_path / "two.log")


def test_a_killed_runner_frees_the_job_when_its_lease_ends(
    cron_env: dict[str, str], tmp_path: Path
) -> None:
    with started(cron_env, "killed", "ShortLease", tmp_path) as killed:
        wait_for(tmp_path / "killed.holding")
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=PATIENCE)
    # Held still (nobody released it), and no longer refreshed: free once the lease
    # (ttl 4 s) ends, and the job runs again.
    key = "django-cron:tasklock-tests.short-lease"
    assert TaskLockService().peek(key) is not None
    deadline = time.monotonic() + PATIENCE
    while TaskLockService().peek(key) is not None:
        assert time.monotonic() < deadline, f"{key} still held"
        time.sleep(0.1)
    (tmp_path / "later.release").touch()
    assert "[✔] tasklock-tests.short-lease" in runcrons(cron_env, "later", "ShortLease", tmp_path)


def test_two_runners_fifty_overlapping_runs_never_overlap(
    cron_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**cron_env, "TASKLOCK_TEST_SIGNALS": str(tmp_path)}
    args = [sys.executable, "-m", JOBS, "50", f"{JOBS}.RecordInterval"]
    runners = [
        subprocess.Popen(args, cwd=processes.ROOT, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        outputs = [runner.communicate(timeout=PATIENCE * 2)[0] for runner in runners]
    finally:
        for runner in runners:
            runner.kill()
            runner.wait()
    assert [runner.returncode for runner in runners] == [0, 0]
    intervals = [
        (float(entry), float(left))
        for found in tmp_path.glob("intervals-*.txt")
        for entry, left in (line.split() for line in found.read_text().splitlines())
    ]
    skipped = sum(output.count("Will try later.") for output in outputs)
    assert intervals, "no run of the job"
    assert overlaps(intervals) == []
    assert len(intervals) + skipped == 100
    assert skipped, "the two runners never contended: the test proved nothing"


# -- in the test process --------------------------------------------------------


@pytest.fixture
def cron_lock() -> Any:
    processes.require_module("django_cron")
    from django_tasklock.contrib.django_cron import TaskLock

    return TaskLock


def job_class(code: str, **attributes: Any) -> type:
    return type("Job", (), {"code": code, "__module__": "myapp.cron", **attributes})


def test_the_backend_holds_the_jobs_key_while_it_runs(cron_lock: Any, key: str) -> None:
    backend = cron_lock(job_class(key, TASKLOCK_OPTIONS={"ttl": 60}), silent=True)
    with backend:
        assert backend.task_lock.key == f"django-cron:{key}"
        assert current_lock() is backend.task_lock
        other = cron_lock(job_class(key), silent=True)
        with pytest.raises(other.LockFailedException, match=r"myapp\.cron\.Job: task lock"):
            other.__enter__()
    assert current_lock() is None
    with lock(f"django-cron:{key}", ttl=60):  # released: free for anyone
        pass


def test_parallel_jobs_take_no_lock(cron_lock: Any, key: str) -> None:
    with (
        lock(f"django-cron:{key}", ttl=60),
        cron_lock(job_class(key, ALLOW_PARALLEL_RUNS=True), silent=True),
    ):
        assert current_lock() is not None  # the test's own, still


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ([("ttl", 60)], TypeError, r"myapp\.cron\.Job\.TASKLOCK_OPTIONS must be a dict"),
        ({"colour": "red"}, TypeError, "colour"),
        ({"ttl": -1}, ValueError, "ttl"),
        ({"cancel_on_loss": True}, TypeError, "cancel_on_loss"),
        ({"limit": 2}, TypeError, "limit"),
    ],
)
def test_bad_options_name_the_problem(
    cron_lock: Any, key: str, options: Any, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        cron_lock(job_class(key, TASKLOCK_OPTIONS=options), silent=True)


def test_check_reports_the_setting_when_django_cron_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(
        INTEGRATIONS,
        "django_cron",
        Integration(
            "tasklock_no_such_module", "django-cron-django5", "django-cron", versions=">=0.6.3"
        ),
    )
    with override_settings(DJANGO_CRON_LOCK_BACKEND=BACKEND):
        (error,) = check_integrations()
        assert error.id == "django_tasklock.E020"
        assert error.msg.startswith(f"DJANGO_CRON_LOCK_BACKEND names {BACKEND.rpartition('.')[0]}")
        assert "pip install 'django-cron-django5>=0.6.3'" in error.msg
        with pytest.raises(SystemCheckError, match=r"django_tasklock\.E020"):
            call_command("check")


def test_check_is_quiet_when_django_cron_is_installed() -> None:
    processes.require_module("django_cron")
    with override_settings(DJANGO_CRON_LOCK_BACKEND=BACKEND):
        assert check_integrations() == []
