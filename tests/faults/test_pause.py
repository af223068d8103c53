"""A holder paused (SIGSTOP) past its ttl: another takes over, and the holder learns it lost.

Python cannot stop a paused holder's work when it resumes: the lock can only
tell it. ``LockResult.lost`` and ``lock_lost`` are that telling; fencing tokens
(see docs/fencing.md) make the protected resource reject what it writes after.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from datetime import timedelta

import pytest

from django_tasklock.api.service import new_token
from django_tasklock.testing import ContractBackend
from tests.support.fault_workers import hold_through

pytestmark = pytest.mark.slow


def test_holder_paused_past_its_ttl_is_taken_over_and_told_it_lost(
    any_backend: ContractBackend, key: str
) -> None:
    if any_backend.recipe is None:
        pytest.skip(f"{any_backend.name}: one process only")
    ttl, interval = 1.5, 0.5
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    holder = ctx.Process(
        target=hold_through, args=(any_backend.recipe, key, ttl, interval, theirs)
    )
    holder.start()
    assert ours.poll(60), "the holder never reported"
    assert ours.recv() == "holding"
    assert holder.pid is not None
    backend, token = any_backend.backend, new_token()
    os.kill(holder.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        life = timedelta(hours=1)
        while not backend.acquire(key, token, ttl=timedelta(seconds=30), max_lifetime=life):
            assert time.monotonic() - stopped < ttl + 1.0, "a paused holder kept the key"
            time.sleep(0.05)
        taken_after = time.monotonic() - stopped
        time.sleep(max(0.0, 3 * ttl - taken_after))
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    assert ttl - interval - 0.5 <= taken_after <= ttl + 1.0
    time.sleep(2 * interval)  # the resumed heartbeat finds the lease someone else's
    ours.send("done")
    assert ours.poll(30), "the holder never finished"
    outcome = ours.recv()
    holder.join(10)
    assert outcome["acquired"]
    assert outcome["lost"], outcome["log"]
    assert outcome["lost_signals"] == [key]
    assert any("was lost" in line for line in outcome["log"])
    assert backend.release(key, token), "the resumed holder released its successor's lease"
