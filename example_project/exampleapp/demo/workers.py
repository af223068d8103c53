"""Starting the demo's workers: real processes, each running ``manage.py demo --worker``.

Each worker sets Django up by itself, as a cron job or task worker on another
node would, and inherits the environment (so ``TASKLOCK_BACKEND`` too). Its
exit status tells the parent what happened.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

MANAGE_PY = Path(__file__).resolve().parents[2] / "manage.py"

RAN = 10  # acquired the lock and did the work
SKIPPED = 11  # the lock was held elsewhere: the work was not done
LOST = 12  # did the work, but the lease was lost meanwhile: exclusion not guaranteed


def spawn(role: str, *args: str) -> subprocess.Popen[bytes]:
    """Start ``manage.py demo --worker ROLE ARGS...`` with this process's environment."""
    # Unbuffered, so that the workers' lines appear when written, even in a pipe.
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, str(MANAGE_PY), "demo", "--skip-checks", "--worker", role]
    return subprocess.Popen([*command, *args], env=env, stdin=subprocess.DEVNULL)


def wait_all(procs: list[subprocess.Popen[bytes]], timeout: float) -> dict[int, int | None]:
    """Each worker's exit status by pid; None for one killed for outliving ``timeout``."""
    deadline = time.monotonic() + timeout
    statuses: dict[int, int | None] = {}
    for proc in procs:
        try:
            statuses[proc.pid] = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stop(proc)
            statuses[proc.pid] = None
    return statuses


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill a worker that is still running (the demo was interrupted or timed out)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def describe(status: int | None) -> str:
    if status is None:
        return "timed out and was killed"
    if status < 0:
        return f"was killed by {signal.Signals(-status).name}"
    return {
        RAN: "ran the job",
        SKIPPED: "skipped",
        LOST: "ran the job but lost its lease",
    }.get(status, f"failed with exit status {status} (see its output above)")
