"""A holder paused (SIGSTOP) past its ttl knows it lost the lease the moment it resumes.

``lock.lost`` compares the clock with the lease's local deadline itself: the
first read after ``SIGCONT`` says True, before the heartbeat or the deadline
watcher has had a turn.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from django_tasklock.testing import ContractBackend
from tests.support.pause_workers import check_through_a_pause

pytestmark = pytest.mark.slow


def test_the_first_check_after_a_pause_past_the_ttl_says_lost(
    any_backend: ContractBackend, key: str
) -> None:
    if any_backend.recipe is None:
        pytest.skip(f"{any_backend.name}: one process only")
    ttl = 0.5
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    holder = ctx.Process(
        target=check_through_a_pause, args=(any_backend.recipe, key, ttl, 0.15, theirs)
    )
    holder.start()
    try:
        assert ours.poll(60), "the holder never reported"
        assert ours.recv() == "holding"
        time.sleep(0.3)
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGSTOP)
        time.sleep(2 * ttl)
        os.kill(holder.pid, signal.SIGCONT)
        assert ours.poll(30), "the holder never reported the pause"
        outcome = ours.recv()
        ours.send("done")
    finally:
        holder.join(10)
        if holder.is_alive():
            holder.kill()
    print(f"{any_backend.name}: {outcome}")
    assert outcome["first_check_after_resume"] is True, outcome
    assert outcome["false_checks_after_resume"] == 0, outcome
    # Declared (lost_event, lock_lost queued) by whichever thread ran first
    # after the resume: the reader, the deadline watcher or the heartbeat.
    assert outcome["declared_after_resume"] is not None
    assert outcome["declared_after_resume"] <= 0.25, outcome
