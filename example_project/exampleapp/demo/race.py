"""Scenario 1: workers released at the same instant all call ``rebuild_rollups()``."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from django_tasklock import TaskLockService
from exampleapp.demo.console import Console
from exampleapp.demo.workers import LOST, RAN, SKIPPED, describe, spawn, stop, wait_all
from exampleapp.tasks import ROLLUPS_KEY, rebuild_rollups

logger = logging.getLogger(__name__)


def startup_seconds(workers: int) -> float:
    """Time for every worker to set Django up and connect before the common start."""
    return 3.0 + 0.5 * workers


def run_race(console: Console, *, workers: int, ttl: float) -> bool:
    """Start the workers, wait for them, and check that exactly one ran the job."""
    console.heading(
        f"1. Race: {workers} worker processes call rebuild_rollups() at the same instant"
    )
    start_at = time.time() + startup_seconds(workers)
    args = ("--ttl", repr(ttl), "--start-at", repr(start_at))
    procs = [spawn("race", *args) for _ in range(workers)]
    try:
        pids = ", ".join(str(proc.pid) for proc in procs)
        console.say(
            f"Started pids {pids}. Each sets Django up, connects, and waits for "
            f"{_clock(start_at)} to call rebuild_rollups() (ttl {ttl:g} s)."
        )
        statuses = wait_all(procs, timeout=start_at - time.time() + ttl + 30)
    finally:
        for proc in procs:
            stop(proc)

    ran = sum(status in (RAN, LOST) for status in statuses.values())
    skipped = sum(status == SKIPPED for status in statuses.values())
    for pid, status in statuses.items():
        if status not in (RAN, SKIPPED):
            console.fail(f"Worker {pid} {describe(status)}.")
    summary = f"{ran} ran, {skipped} skipped"
    if ran == 1 and skipped == workers - 1 and LOST not in statuses.values():
        console.ok(f"{summary}: exactly one worker rebuilt the rollups.")
        return True
    console.fail(f"{summary}: expected exactly 1 ran, {workers - 1} skipped.")
    return False


def race_worker(*, ttl: float, start_at: float) -> int:
    """One racer: get ready, wait for the common start, try to rebuild. Returns the exit status."""
    TaskLockService().peek(ROLLUPS_KEY)  # connect now, not during the race
    late = time.time() - start_at
    if late > 0:
        logger.warning("ready %.2f s after the common start time: this worker is late", late)
    else:
        time.sleep(-late)
    result = rebuild_rollups(ttl=ttl)
    if not result.acquired:
        return SKIPPED
    return LOST if result.lost else RAN


def _clock(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%H:%M:%S.%f")[:-3]
