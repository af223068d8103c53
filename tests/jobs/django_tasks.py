"""Tasks of Django's Tasks framework (``django.tasks``, or the django-tasks backport)."""

from __future__ import annotations

import os
from typing import Any

from django_tasklock import exclusive
from tests.jobs import hold
from tests.support import framework_runs, rerun_runs

try:  # Django >= 6.0
    from django.tasks import task
except ImportError:  # the backport
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]


@task()
@exclusive("django-task:{key}", ttl=60)
def hold_key(key: str, job: str, signals: str) -> str | None:
    """Hold ``django-task:key`` until the test releases ``job``."""
    return hold(job, signals)


def note_skipped(key: str, signals: str, pause: float) -> str:
    """``on_locked`` of :func:`record`: says which ``db_worker`` process skipped."""
    framework_runs.skipped(signals, os.getpid())
    return "skipped"


@task()
@exclusive("django-task:{key}", ttl=60, on_locked=note_skipped)
def record(key: str, signals: str, pause: float) -> str:
    """Hold ``django-task:key`` for ``pause`` seconds; write the interval held and the process."""
    framework_runs.held_for(signals, pause, os.getpid())
    return "ran"


@exclusive("django-task:{key}", ttl=60, on_locked="rerun")
def _rebuild(key: str, signals: str, worker: int, n: int) -> bool:
    return rerun_runs.body(signals, worker, n)


@task()
def rebuild(key: str, signals: str, n: int) -> None:
    """``rerun_runs.job`` of a function under ``@exclusive(..., on_locked="rerun")``."""
    rerun_runs.job(lambda f, w, m: _rebuild(key, f, w, m), signals, os.getpid(), n)


#: What ``contrib.reruns`` described from inside each run of :func:`describe_running`.
described: list[dict[str, Any] | None] = []


@task()
def describe_running(n: int) -> None:
    """Note what ``on_locked="rerun"`` would send again, read inside the task."""
    from django_tasklock.contrib import reruns

    described.append(reruns.django_tasks_describe())
