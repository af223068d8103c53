"""Functions that django-q2 schedules run on real ``qcluster`` processes in the tests."""

from __future__ import annotations

import os
import time
from pathlib import Path

from django_tasklock import exclusive
from tests.jobs import PATIENCE, hold
from tests.support import framework_runs, rerun_runs


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


@exclusive("q2:{key}", ttl=900)
def crash_once(key: str, signals: str) -> str:
    """The first run waits to be killed; the one delivered again after it ends."""
    folder = Path(signals)
    with (folder / "starts").open("a") as starts:
        starts.write(f"{os.getpid()}\n")
    if len((folder / "starts").read_text().split()) == 1:
        (folder / "first.holding").write_text(str(os.getpid()))
        time.sleep(PATIENCE)
        raise TimeoutError("the first run was not killed")
    return "ran again"


@exclusive("q2:{key}", ttl=60, on_locked="rerun")
def _rebuild(key: str, signals: str, worker: int, n: int) -> bool:
    return rerun_runs.body(signals, worker, n)


def rebuild(key: str, signals: str, n: int) -> None:
    """``rerun_runs.job`` of a function under ``@exclusive(..., on_locked="rerun")``."""
    rerun_runs.job(lambda f, w, m: _rebuild(key, f, w, m), signals, os.getpid(), n)
