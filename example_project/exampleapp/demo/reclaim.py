"""Scenario 2: the worker holding a lock dies by SIGKILL; another takes its key over.

Nobody releases the dead worker's lock or cleans up. On Linux its token names
what proves, on this machine, that its process is gone (``/proc``): the next
attempt here takes the key over at once. Elsewhere (macOS, Windows) the lease
simply stops being renewed and runs out, after at most ``ttl``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time

from django_tasklock import HeldLock, TaskLockService, run_exclusive
from exampleapp.demo.console import Console
from exampleapp.demo.workers import LOST, RAN, SKIPPED, spawn, stop

logger = logging.getLogger(__name__)

KEY = "send-nightly-report"
GRACE = 3.0  # seconds after ttl by which the key must be acquirable again
TOLERANCE = 0.3  # seconds of slack for polling and scheduling in the checks
POLL = 0.1  # seconds between attempts to take the key over


def run_reclaim(console: Console, *, ttl: float) -> bool:
    console.heading("2. Crash: the worker holding a lock is killed with SIGKILL")
    proc = spawn("hold", "--ttl", repr(ttl))
    try:
        return _crash_and_reclaim(console, proc, ttl=ttl)
    finally:
        stop(proc)


def _crash_and_reclaim(console: Console, proc: subprocess.Popen[bytes], *, ttl: float) -> bool:
    backend = TaskLockService().backend
    held = _wait_for_holder(proc)
    if held is None:
        console.fail(f"Worker {proc.pid} was never seen holding {KEY!r}.")
        return False
    console.say(
        f"Worker {proc.pid} holds {KEY!r} with a {ttl:g} s ttl; its heartbeat renews the "
        f"lease every {ttl / 3:.3g} s."
    )
    time.sleep(ttl + 1)
    held = backend.peek(KEY)
    if held is None or held.holder.pid != proc.pid:
        console.fail(f"Worker {proc.pid} lost {KEY!r} while alive and working.")
        return False
    console.say(
        f"{ttl + 1:g} s later, longer than the ttl, it still holds it (lease ends in "
        f"{held.seconds_left:.1f} s)."
    )

    os.kill(proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    proc.wait()
    console.say(f"SIGKILL sent to worker {proc.pid}: it releases nothing, its heartbeat stops.")
    if held.holder.machine is not None:  # this machine can prove the worker gone
        return _taken_over_at_once(console, proc, ttl=ttl, killed_at=killed_at)

    attempt = run_exclusive(KEY, _take_over, ttl=ttl)
    held, peeked_at = backend.peek(KEY), time.monotonic()
    if attempt.acquired or held is None or held.holder.pid != proc.pid:
        console.fail(f"{KEY!r} was not held by the dead worker right after the kill.")
        return False
    left = peeked_at - killed_at + held.seconds_left  # from the kill to the lease's end
    console.say(
        f"Another attempt at once is refused: {KEY!r} is held by {held.holder}, a dead "
        f"process, for {held.seconds_left:.2f} s more. Retrying every {POLL:g} s..."
    )

    reclaimed_at = _poll_until_acquired(ttl=ttl, deadline=killed_at + ttl + GRACE)
    if reclaimed_at is None:
        console.fail(f"{KEY!r} was still not acquirable {ttl + GRACE:g} s after the kill.")
        return False
    after = reclaimed_at - killed_at
    console.say(
        f"Reclaimed {after:.2f} s after the kill; the lease had {left:.2f} s left then "
        f"(ttl {ttl:g} s)."
    )
    if after < left - TOLERANCE:
        console.fail(f"Reclaimed {left - after:.2f} s before the dead worker's lease ended.")
        return False
    console.ok("The dead worker's lock was reclaimed when its lease expired, by itself.")
    return True


def _taken_over_at_once(
    console: Console, proc: subprocess.Popen[bytes], *, ttl: float, killed_at: float
) -> bool:
    held = TaskLockService().backend.peek(KEY)
    if held is None or held.holder.pid != proc.pid:
        console.fail(f"{KEY!r} was not held by the dead worker right after the kill.")
        return False
    attempt = run_exclusive(KEY, _take_over, ttl=ttl)
    if attempt.result is None:
        console.fail(f"{KEY!r} was refused although its holder, worker {proc.pid}, is gone.")
        return False
    console.say(
        f"Another attempt at once takes it over, {attempt.result - killed_at:.2f} s after "
        f"the kill, though its lease had {held.seconds_left:.2f} s left: its holder's "
        "process is gone, and this machine can prove it (no process has its pid)."
    )
    console.say(
        "A worker on another machine cannot: for it, the key frees once the heartbeat of a "
        "process here holding a lock reaps it, or when the lease runs out."
    )
    console.ok("The dead worker's lock was taken over at once, by itself.")
    return True


def _wait_for_holder(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> HeldLock | None:
    """The lease once ``proc`` holds ``KEY``; None if it dies or times out first."""
    backend = TaskLockService().backend
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        held = backend.peek(KEY)
        if held is not None and held.holder.pid == proc.pid:
            return held
        time.sleep(0.05)
    return None


def _poll_until_acquired(*, ttl: float, deadline: float) -> float | None:
    """When (``time.monotonic()``) this process took ``KEY`` over; None if not by ``deadline``."""
    while time.monotonic() < deadline:
        result = run_exclusive(KEY, _take_over, ttl=ttl)
        if result.acquired:
            return result.result
        time.sleep(POLL)
    return None


def _take_over() -> float:
    acquired_at = time.monotonic()
    logger.info("acquired %r: sending the nightly report in place of the dead worker", KEY)
    return acquired_at


def hold_worker(*, ttl: float) -> int:
    """The worker that gets killed: takes ``KEY``, works until it is; returns the exit status."""
    result = run_exclusive(KEY, _work_until_killed, ttl=ttl, refresh_interval=ttl / 3)
    if not result.acquired:
        logger.warning("%r was held elsewhere", KEY)
        return SKIPPED
    return LOST if result.lost else RAN


def _work_until_killed(limit: float = 60.0) -> None:
    logger.info("acquired %r: sending the nightly report (slowly)...", KEY)
    started = time.monotonic()
    while time.monotonic() - started < limit:  # ends by itself if nobody kills it
        time.sleep(1)
        logger.info("  still sending, %.0f s in", time.monotonic() - started)
