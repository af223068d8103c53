"""What task-framework jobs wrote about their runs: the intervals they held a key, who skipped.

A job that ran writes ``<uuid>.ran`` (``entry exit worker``: the host's clock
read after the lock was granted and before it is released, and the worker
process); one skipped writes ``<uuid>.skipped`` (the worker). Two intervals
of one key that overlap prove two holders at once (``tests.support.volume_workers.overlaps``).
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.support.volume_workers import Interval, overlaps


def _write(folder: Path, suffix: str, text: str) -> None:
    name = uuid.uuid4().hex
    (folder / f"{name}.tmp").write_text(text)
    os.replace(folder / f"{name}.tmp", folder / f"{name}{suffix}")  # never read half-written


def held_for(signals: str, pause: float, worker: int) -> None:
    """In a job holding its key: sleep ``pause`` s and write the interval held, as ``.ran``."""
    entry = time.time()  # read after the lock was granted; the exit before it is released
    time.sleep(pause)
    _write(Path(signals), ".ran", f"{entry} {time.time()} {worker}")


def skipped(signals: str, worker: int) -> None:
    """In a job whose key was held: write who skipped it, as ``.skipped``."""
    _write(Path(signals), ".skipped", str(worker))


def retried(signals: str, attempt: int) -> None:
    """Try ``attempt`` (from 1) of an ``on_locked="retry"`` job found its key held: ``.retry``."""
    _write(Path(signals), ".retry", f"{attempt} {time.time()}")


def retries(folder: Path) -> list[int]:
    """The tries that found their key held and asked for a retry (``.retry``), in order."""
    return sorted(int(path.read_text().split()[0]) for path in folder.glob("*.retry"))


@dataclass
class Runs:
    intervals: list[Interval]
    ran_by: list[str]  # the worker of each run
    skipped_by: list[str]  # the worker of each skip

    @property
    def workers(self) -> set[str]:
        return {*self.ran_by, *self.skipped_by}


def read_runs(folder: Path) -> Runs:
    runs = Runs([], [], [])
    for path in folder.glob("*.ran"):
        entry, exit_, worker = path.read_text().split()
        runs.intervals.append((float(entry), float(exit_)))
        runs.ran_by.append(worker)
    runs.skipped_by = [path.read_text().strip() for path in folder.glob("*.skipped")]
    return runs


def await_runs(folder: Path, count: int, timeout: float = 120.0) -> Runs:
    """The runs once ``count`` jobs have written theirs; ``TimeoutError`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        runs = read_runs(folder)
        done = len(runs.ran_by) + len(runs.skipped_by)
        if done >= count:
            return runs
        if time.monotonic() > deadline:
            raise TimeoutError(f"{done} of {count} jobs reported within {timeout} s")
        time.sleep(0.1)


def assert_one_at_a_time(runs: Runs, count: int) -> None:
    """``count`` triggers of one key: none overlapped, some were skipped, by two workers."""
    assert len(runs.ran_by) + len(runs.skipped_by) == count
    assert overlaps(runs.intervals) == []
    assert runs.ran_by, "no job ran"
    assert runs.skipped_by, "there was no contention: no job was skipped"
    assert len(runs.workers) == 2, f"the jobs were not shared by two workers: {runs.workers}"
