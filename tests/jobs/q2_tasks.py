"""Functions that django-q2 schedules run on real ``qcluster`` processes in the tests."""

from __future__ import annotations

import os

from django_tasklock import exclusive
from tests import framework_runs
from tests.jobs import hold


@exclusive("q2:{key}", ttl=60)
def hold_key(key: str, job: str, signals: str) -> str:
    """Hold ``q2:key`` until the test releases ``job``."""
    return hold(job, signals)


def note_skipped(key: str, pause: float, signals: str) -> str:
    """``on_locked`` of :func:`record`: says which worker process skipped."""
    framework_runs.skipped(signals, os.getpid())
    return "skipped"


@exclusive("q2:{key}", ttl=60, on_locked=note_skipped)
def record(key: str, pause: float, signals: str) -> str:
    """Hold ``q2:key`` for ``pause`` seconds and write the interval held."""
    framework_runs.held_for(signals, pause, os.getpid())
    return "ran"
