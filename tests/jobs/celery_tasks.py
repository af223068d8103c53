"""A Celery app and task for the worker the tests start (``celery -A tests.jobs.celery_tasks``).

Broker and queue come from the environment the test gives the worker;
results travel back over the broker (the ``rpc://`` result backend).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import django
from celery import Celery, shared_task
from celery.signals import task_retry
from django.apps import apps
from kombu.entity import Queue

from django_tasklock import LockLost, checkpoint, exclusive
from tests.jobs import PATIENCE, hold
from tests.support import framework_runs, rerun_runs

if not apps.ready:  # in the worker; the test process has set Django up already
    django.setup()

app = Celery(
    "tasklock_tests",
    broker=os.environ.get("TASKLOCK_TEST_AMQP_URL", "memory://"),
    backend="rpc://",
)
queue = os.environ.get("TASKLOCK_TEST_CELERY_QUEUE", "tasklock-tests")
app.conf.update(
    task_default_queue=queue,
    # Gone from the broker once the test's worker stops.
    task_queues=[Queue(queue, durable=False, auto_delete=True)],
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)


@shared_task
@exclusive("celery:{key}", ttl=60)
def hold_key(key: str, job: str, signals: str) -> str:
    """Hold ``celery:key`` until the test releases ``job``."""
    return hold(job, signals)


def note_skipped(key: str, signals: str, pause: float) -> str:
    """``on_locked`` of :func:`record`: says which worker process (pool child) skipped."""
    framework_runs.skipped(signals, os.getpid())
    return "skipped"


@shared_task
@exclusive("celery:{key}", ttl=60, on_locked=note_skipped)
def record(key: str, signals: str, pause: float) -> str:
    """Hold ``celery:key`` for ``pause`` seconds; write the interval held and the process."""
    framework_runs.held_for(signals, pause, os.getpid())
    return "ran"


@shared_task(bind=True, max_retries=3)
def retry_when_lost(self: Any, key: str, job: str, signals: str) -> str | None:
    """A lost lock becomes a retry (``self.retry()`` on ``LockLost``): docs/lost-locks.md."""
    try:
        return work_until_released(key, job, signals, self.request.retries)
    except LockLost as exc:
        raise self.retry(exc=exc, countdown=0) from exc


@exclusive("celery:{key}", ttl=30, refresh_interval=0.2, on_lost="raise")
def work_until_released(key: str, job: str, signals: str, attempt: int) -> str:
    """Announce ``job.<attempt>.holding``, then work in steps until ``job.release`` appears."""
    folder = Path(signals)
    (folder / f"{job}.{attempt}.holding").write_text(str(os.getpid()))
    deadline = time.monotonic() + PATIENCE
    while not (folder / f"{job}.release").exists():
        checkpoint()  # raises LockLost once the lock is lost
        if time.monotonic() > deadline:
            raise TimeoutError(f"{job}.release did not appear")
        time.sleep(0.05)
    return f"ran:{job}:attempt {attempt}"


@exclusive("celery:{key}", ttl=60, on_locked="rerun")
def _rebuild(key: str, signals: str, worker: int, n: int) -> bool:
    """Under ``@exclusive(..., on_locked="rerun")``, called by the task :func:`rebuild`:
    a skipped call marks the key with that task's call, which the holder sends again."""
    return rerun_runs.body(signals, worker, n)


@shared_task
def rebuild(key: str, signals: str, n: int) -> None:
    """``rerun_runs.job`` of :func:`_rebuild`, called in this task's run."""
    rerun_runs.job(lambda f, w, m: _rebuild(key, f, w, m), signals, os.getpid(), n)


@shared_task
@exclusive("celery:{key}", ttl=60, on_locked="retry")
def retried(key: str, signals: str) -> str:
    """Retried by Celery while ``celery:key`` is held; once it holds it, writes its run."""
    framework_runs.held_for(signals, 0.0, os.getpid())
    return "ran"


@task_retry.connect
def note_retry(sender: Any, request: Any, **kwargs: Any) -> None:
    """Celery's ``task_retry`` in the worker: each try of :func:`retried` retried (``.retry``)."""
    if sender.name == retried.name:  # ``request.retries``: the retries before this try
        framework_runs.retried(request.args[1], int(request.retries) + 1)


@shared_task
def ping() -> str:
    return "pong"
