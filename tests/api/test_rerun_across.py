"""``on_locked="rerun"`` across processes: the mark lives in the storage, not in a caller.

With real processes (``spawn``), on every storage that serves several
processes (SQLite, PostgreSQL, MariaDB, Redis once its backend can mark a
key; the memory backend serves one process and is skipped):

* a process that marks the key and exits leaves its mark: the holder, in
  this process, runs its work exactly once more when its run ends;
* a holder SIGKILLed in its work leaves the mark to the key's next holder,
  which runs its own run and then once more.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from typing import Any

import pytest
from django.db import connections

from django_tasklock import TaskLockService
from django_tasklock.testing import ContractBackend
from django_tasklock.testing.support import cross_process_recipe
from django_tasklock.testing.workers import BackendRecipe
from tests.support.rerun_workers import hold_with_rerun_until_killed, mark_and_exit

pytestmark = [pytest.mark.databases]

PATIENCE = 120  # a generous bound for a condition, never a pause


def recipe_for(subject: ContractBackend) -> BackendRecipe:
    """The subject's recipe for a child, or a skip: memory serves one process only."""
    return cross_process_recipe(subject)


def test_a_mark_outlives_the_process_that_made_it(any_backend: ContractBackend, key: str) -> None:
    recipe = recipe_for(any_backend)
    service = TaskLockService(any_backend.backend)
    runs: list[int] = []
    started, go = threading.Event(), threading.Event()

    def work() -> int:
        runs.append(len(runs))
        if len(runs) == 1:
            started.set()
            assert go.wait(PATIENCE), "the test never let the first run go"
        return len(runs)

    out: list[Any] = []

    def hold() -> None:
        try:
            out.append(service.run_exclusive(key, work, on_locked="rerun"))
        finally:
            connections.close_all()  # this thread's

    holder = threading.Thread(target=hold)
    holder.start()
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    marker = ctx.Process(target=mark_and_exit, args=(recipe, key, child))
    try:
        assert started.wait(PATIENCE), "the holder never began its work"
        marker.start()
        child.close()  # the child's end: this process keeps only its own
        assert parent.poll(PATIENCE), "the marking process never answered"
        assert parent.recv() == ("result", (False, True)), "marked, not taken: rerun=True"
        marker.join(PATIENCE)
        assert marker.exitcode == 0, f"the marking process ended with {marker.exitcode}"
        # The marker is gone; its mark is in the storage, bound to no process.
        assert list(any_backend.backend.rerun_marks(key)) == [key]
        assert runs == [0], "the holder is still in its first run"
    finally:
        go.set()
        holder.join(PATIENCE)
        if marker.is_alive():
            marker.kill()
            marker.join(30)
        parent.close()
    assert not holder.is_alive()
    assert runs == [0, 1], "exactly one run more, after the marker exited"
    (result,) = out
    assert result.acquired
    assert result.result == 2  # the last run's
    assert not result.rerun
    assert any_backend.backend.rerun_marks(key) == {}
    assert any_backend.backend.peek(key) is None


def test_a_killed_holder_leaves_the_mark_to_the_next_holder(
    any_backend: ContractBackend, key: str
) -> None:
    recipe = recipe_for(any_backend)
    backend = any_backend.backend
    # A provably dead holder's key is taken over at once: its ttl may be long.
    # Otherwise the next holder waits for the ttl: a short one.
    ttl = 60.0 if backend.capabilities.dead_holders else 2.0
    service = TaskLockService(backend)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    victim = ctx.Process(target=hold_with_rerun_until_killed, args=(recipe, key, ttl, child))
    victim.start()
    child.close()
    runs: list[str] = []
    try:
        assert parent.poll(PATIENCE), "the holder never began its work"
        assert parent.recv() == ("began", None)
        skipped = service.run_exclusive(key, lambda: runs.append("skipped"), on_locked="rerun")
        assert not skipped.acquired
        assert skipped.rerun
        os.kill(victim.pid or 0, signal.SIGKILL)
        victim.join(PATIENCE)
        assert victim.exitcode == -signal.SIGKILL
    finally:
        if victim.is_alive():
            victim.kill()
            victim.join(30)
        parent.close()
    assert runs == []
    assert list(backend.rerun_marks(key)) == [key], "the dead holder left the mark"
    # The next holder owes the run: its own, then once more.
    result = service.run_exclusive(
        key, lambda: runs.append("next"), on_locked="rerun", ttl=ttl, wait=60
    )
    assert result.acquired
    assert not result.rerun
    assert runs == ["next", "next"]
    assert backend.rerun_marks(key) == {}
    assert backend.peek(key) is None
