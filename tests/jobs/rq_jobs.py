"""RQ job functions run by real ``manage.py rqworker`` processes (django-rq) in the tests."""

from __future__ import annotations

import os
import time
from pathlib import Path

from django_tasklock import exclusive as core_exclusive
from django_tasklock.contrib.rq import exclusive
from tests.jobs import PATIENCE, hold
from tests.support import framework_runs, rerun_runs


@exclusive("rq:{key}", ttl=60)
def hold_key(key: str, job: str, signals: str) -> str:
    """Hold ``rq:key`` until the test releases ``job``."""
    return hold(job, signals)


def note_skipped(key: str, signals: str, pause: float) -> str:
    """``on_locked`` of :func:`record`: says which worker skipped (the forked horse's parent)."""
    framework_runs.skipped(signals, os.getppid())
    return "skipped"


@exclusive("rq:{key}", ttl=60, on_locked=note_skipped)
def record(key: str, signals: str, pause: float) -> str:
    """Hold ``rq:key`` for ``pause`` seconds; write the interval held and the worker's pid."""
    framework_runs.held_for(signals, pause, os.getppid())
    return "ran"


@exclusive("rq:{key}", ttl=60, on_locked="retry")  # contrib.rq's, passing it to the core
def retried(key: str, signals: str) -> str:
    """Returns RQ's ``Retry`` while ``rq:key`` is held; once it holds it, writes its run."""
    framework_runs.held_for(signals, 0.0, os.getppid())
    return "ran"


def ping() -> str:
    return "pong"


class KeyHeld(Exception):
    """What :func:`refuse` raises: the job fails, and RQ may run it again (same id)."""


def refuse(key: str) -> str:
    """``on_locked`` of :func:`run_or_fail`: the job fails while its key is held."""
    raise KeyHeld(f"rq:{key} is held")


@exclusive("rq:{key}", ttl=60, on_locked=refuse)
def run_or_fail(key: str) -> str:
    """Fails while ``rq:key`` is held (then requeued by the test, it runs)."""
    return "ran"


@exclusive("rq:{key}", ttl=60)
def quick(key: str) -> str:
    return "quick"


def calls_quick(key: str) -> str:
    """A job (no lock of its own) calling an ``@exclusive`` function: its meta is its own."""
    return f"called:{quick(key)}"


@exclusive("rq:{key}", ttl=900)
def crash_once(key: str, signals: str) -> str:
    """The first run (its work horse) waits to be killed; the retry RQ enqueues ends."""
    folder = Path(signals)
    with (folder / "starts").open("a") as starts:
        starts.write(f"{os.getpid()}\n")
    if len((folder / "starts").read_text().split()) == 1:
        (folder / "first.holding").write_text(str(os.getpid()))
        time.sleep(PATIENCE)
        raise TimeoutError("the first run was not killed")
    return "ran again"


# The core decorator, on these workers' Redis backend (contrib.rq's passes "rerun" to it).
@core_exclusive("rq-rerun:{key}", ttl=60, on_locked="rerun")
def _rebuild(key: str, signals: str, worker: int, n: int) -> bool:
    return rerun_runs.body(signals, worker, n)


def rebuild(key: str, signals: str, n: int) -> None:
    """``rerun_runs.job`` of a function under ``@exclusive(..., on_locked="rerun")``; the
    worker is the work horse's parent, the ``rqworker`` process."""
    rerun_runs.job(lambda f, w, m: _rebuild(key, f, w, m), signals, os.getppid(), n)
