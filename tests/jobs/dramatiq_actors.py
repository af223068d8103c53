"""Dramatiq actors run by real ``dramatiq`` worker processes (django-dramatiq) in the tests.

Each actor's last argument is the test's folder of signal files.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dramatiq

from django_tasklock import exclusive
from tests.jobs import PATIENCE, hold
from tests.support import framework_runs, rerun_runs

QUEUE = os.environ.get("TASKLOCK_TEST_DRAMATIQ_QUEUE", "tasklock-tests")


@dramatiq.actor(
    queue_name=QUEUE, max_retries=0, exclusive="dramatiq:{key}", exclusive_options={"ttl": 60}
)
def hold_key(key: str, job: str, signals: str) -> None:
    """Hold ``dramatiq:key`` until the test releases ``job``; skipped while it is held."""
    hold(job, signals)


@dramatiq.actor(
    queue_name=QUEUE,
    max_retries=50,
    min_backoff=100,
    max_backoff=300,
    exclusive="dramatiq:{key}",
    exclusive_options={"ttl": 60},
    when_held="retry",
)
def hold_key_or_retry(key: str, job: str, signals: str) -> None:
    """:func:`hold_key`, retried by the ``Retries`` middleware while the key is held."""
    hold(job, signals)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, exclusive="dramatiq:{key}")
def record(key: str, pause: float, signals: str) -> None:
    """Hold ``dramatiq:key`` for ``pause`` seconds and write the interval held."""
    framework_runs.held_for(signals, pause, os.getpid())


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def ping(signals: str) -> None:
    (Path(signals) / "pong").write_text(str(os.getpid()))


@dramatiq.actor(
    queue_name=QUEUE, max_retries=0, exclusive="dramatiq:{key}", exclusive_options={"ttl": 900}
)
def crash_once(key: str, signals: str) -> None:
    """The first run waits to be killed; the one delivered again after it ends."""
    folder = Path(signals)
    with (folder / "starts").open("a") as starts:
        starts.write(f"{os.getpid()}\n")
    if len((folder / "starts").read_text().split()) == 1:
        (folder / "first.holding").write_text(str(os.getpid()))
        time.sleep(PATIENCE)
        raise TimeoutError("the first run was not killed")
    (folder / "done").write_text(str(os.getpid()))


@exclusive("dramatiq-rerun:{key}", ttl=60, on_locked="rerun")
def _rebuild(key: str, signals: str, worker: int, n: int) -> bool:
    return rerun_runs.body(signals, worker, n)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def rebuild(key: str, signals: str, n: int) -> None:
    """``rerun_runs.job`` of a function under the core ``@exclusive(..., on_locked="rerun")``
    (not the ``exclusive`` actor option): the worker is the worker process."""
    rerun_runs.job(lambda f, w, m: _rebuild(key, f, w, m), signals, os.getpid(), n)


# throws=TypeError: a RetryUnavailable (no retrier knew the message) fails it at once,
# rather than being retried by the Retries middleware's own backoff.
@dramatiq.actor(queue_name=QUEUE, max_retries=20, throws=(TypeError,))
def retry_when_held(key: str, job: str, signals: str) -> None:
    """Note each try (``<job>.tries``), then run :func:`retried_when_held`."""
    with (Path(signals) / f"{job}.tries").open("a") as tries:
        tries.write(f"{os.getpid()}\n")
    retried_when_held(key, job, signals)


@exclusive("dramatiq:{key}", on_locked="retry", ttl=60)
def retried_when_held(key: str, job: str, signals: str) -> None:
    """The core's ``on_locked="retry"``: a held key raises ``dramatiq.Retry(delay=...)``."""
    with (Path(signals) / f"{job}.runs").open("a") as runs:
        runs.write(f"{time.time()}\n")
