"""Huey tasks run by real ``run_huey`` consumers (djhuey) in tests/frameworks/test_huey.py.

Every task takes the test's folder of signal files first: the ``SIGNAL_LOCKED``
handler writes ``<task id>.locked`` there, in the consumer, when a task was not
run because its lock was held. Keys carry the queue's name, unique per run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from huey.contrib.djhuey import HUEY, db_task, signal
from huey.signals import SIGNAL_LOCKED

from django_tasklock import exclusive
from django_tasklock.contrib.huey import lock_task
from tests.jobs import hold
from tests.support import rerun_runs

#: Keys of this run: the queue's name is unique per test run.
RETRIED_KEY = f"huey:{HUEY.name}:retried"
VOLUME_KEY = f"huey:{HUEY.name}:volume"


@signal(SIGNAL_LOCKED)
def note_locked(signal_name: str, task: Any, *args: Any) -> None:
    """Leave ``<task id>.locked`` in the task's signal folder (its first argument)."""
    (Path(task.args[0]) / f"{task.id}.locked").write_text(signal_name)


def lock_name(key: str) -> str:
    return f"huey:{HUEY.name}:{key}"


@db_task()
def hold_key(signals: str, key: str, job: str) -> str:
    """Hold ``lock_name(key)`` (the context manager form) until the test releases ``job``."""
    with lock_task(lock_name(key), ttl=60):
        return hold(job, signals)


@db_task()
def hold_briefly(signals: str, key: str, job: str) -> str:
    """The same with a 4 s lease, refreshed every 0.5 s while the consumer lives."""
    with lock_task(lock_name(key), ttl=4, refresh_interval=0.5):
        return hold(job, signals)


@db_task()
def hold_for_long(signals: str, key: str, job: str) -> str:
    """:func:`hold_key` with a 15 min lease: only a proof of death frees it sooner."""
    with lock_task(lock_name(key), ttl=900):
        return hold(job, signals)


@db_task(retries=5, retry_delay=1)
@lock_task(RETRIED_KEY, ttl=60)
def retried(signals: str, job: str) -> str:
    """The decorator form: a held lock makes Huey retry it, a second later."""
    (Path(signals) / f"{job}.ran").touch()
    return f"ran:{job}"


@db_task()
@lock_task(VOLUME_KEY, ttl=30)
def record_interval(signals: str, seconds: float) -> tuple[float, float]:
    """Hold the volume key for ``seconds``; return when it entered and left (host clock)."""
    entry = time.time()
    time.sleep(seconds)
    return entry, time.time()


@exclusive("huey-rerun:{key}", ttl=60, on_locked="rerun")
def _rebuild(key: str, signals: str, worker: int, n: int) -> bool:
    return rerun_runs.body(signals, worker, n)


@db_task()
def rebuild(signals: str, key: str, n: int) -> None:
    """``rerun_runs.job`` of a function under the core ``@exclusive(..., on_locked="rerun")``
    (not ``lock_task``): the worker is the consumer's process."""
    rerun_runs.job(lambda f, w, m: _rebuild(key, f, w, m), signals, os.getpid(), n)


@db_task()
def retry_when_held(signals: str, key: str, job: str) -> str | None:
    """Note each try (``<job>.tries``), then run :func:`retried_when_held`."""
    with (Path(signals) / f"{job}.tries").open("a") as tries:
        tries.write(f"{time.time()}\n")
    return retried_when_held(signals, key, job)


@exclusive(key=lambda signals, key, job: lock_name(key), on_locked="retry", ttl=60)
def retried_when_held(signals: str, key: str, job: str) -> str:
    """The core's ``on_locked="retry"``: a held key raises ``RetryTask(delay=...)``
    (the consumer knows the task by the hooks of ``install(HUEY)``, apps.py)."""
    with (Path(signals) / f"{job}.runs").open("a") as runs:
        runs.write(f"{time.time()}\n")
    return f"ran:{job}"
