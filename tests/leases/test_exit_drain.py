"""A loss announced as the process ends is announced in full: the exit drains the notifier.

The notifier is a daemon thread: a job that stops on its loss (``LockLost``)
and ends its process would otherwise cut the ``lock_lost`` receivers short.
Real processes (``tests/support/exit_workers.py``), four at a time so that a
race shows: each loses its lock (the key deleted behind its heartbeat's back),
sees ``lock.lost``, and ends, while its receiver still has half a second to go.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from django_tasklock.testing import BackendRecipe, ContractBackend
from tests.support.processes import ROOT

pytestmark = pytest.mark.slow

CHILDREN = 4
#: Seconds the parent gives a child to end: far past the exit's bound.
GENEROUS = 60
#: For what does not depend on the storage: the memory backend and SQLite.
ONE_PROCESS_OR_A_FILE = pytest.mark.parametrize("any_backend", ["memory", "sqlite"], indirect=True)


def _recipe(backend: ContractBackend) -> BackendRecipe:
    if backend.recipe is not None:
        return backend.recipe
    # The memory backend lives in the child's own process: the child builds its own.
    return BackendRecipe(
        backend="django_tasklock.backends.memory.MemoryBackend",
        settings={"INSTALLED_APPS": ["django_tasklock"]},
    )


def _run(backend: ContractBackend, key: str, mode: str, tmp_path: Path) -> list[Path]:
    """Start ``CHILDREN`` holders in ``mode`` at once, wait for each to end; their markers."""
    started: list[tuple[subprocess.Popen[bytes], Path, Path]] = []
    recipe = dataclasses.asdict(_recipe(backend))
    for n in range(CHILDREN):
        marker, log = tmp_path / f"marker-{mode}-{n}", tmp_path / f"log-{mode}-{n}"
        spec = {"mode": mode, "recipe": recipe, "key": f"{key}-{n}", "marker": str(marker)}
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.exit_workers", json.dumps(spec)],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a forked child left behind is killed with it
            )
        started.append((process, marker, log))
    try:
        for process, _, log in started:
            try:
                process.wait(timeout=GENEROUS)
            except subprocess.TimeoutExpired:
                pytest.fail(f"a holder ({mode}) did not end within {GENEROUS} s")
            assert process.returncode == 0, log.read_text(errors="replace")
    finally:
        for process, _, _ in started:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return [marker for _, marker, _ in started]


@pytest.mark.parametrize("mode", ["return", "exit"])
def test_a_receiver_of_a_loss_seen_before_the_exit_runs_to_its_end(
    any_backend: ContractBackend, key: str, mode: str, tmp_path: Path
) -> None:
    markers = _run(any_backend, key, mode, tmp_path)
    done = [marker.read_text() for marker in markers if marker.exists()]
    assert done == ["released_by_operator"] * CHILDREN, f"{len(done)} of {CHILDREN}: {done}"


def test_what_is_queued_while_the_exit_drains_runs_too(
    any_backend: ContractBackend, key: str, tmp_path: Path
) -> None:
    # The first receiver, run at the exit, waits for a second loss the
    # heartbeat declares then: that announcement is run before the process ends.
    markers = _run(any_backend, key, "queued", tmp_path)
    expected = [*markers, *(marker.with_name(marker.name + "-second") for marker in markers)]
    missing = [marker.name for marker in expected if not marker.exists()]
    assert not missing, f"{len(missing)} of {len(expected)} receivers cut short: {missing}"


@ONE_PROCESS_OR_A_FILE
def test_a_loss_seen_before_its_announcement_is_queued_is_announced(
    any_backend: ContractBackend, key: str, tmp_path: Path
) -> None:
    # The heartbeat sets ``lost`` and runs the lease's loss callbacks before it
    # queues ``lock_lost``: the exit waits for the declaration too.
    markers = _run(any_backend, key, "callback", tmp_path)
    done = [marker.read_text() for marker in markers if marker.exists()]
    assert done == ["released_by_operator"] * CHILDREN, f"{len(done)} of {CHILDREN}: {done}"


@ONE_PROCESS_OR_A_FILE
def test_a_receiver_that_never_returns_does_not_keep_the_process_alive(
    any_backend: ContractBackend, key: str, tmp_path: Path
) -> None:
    markers = _run(any_backend, key, "hang", tmp_path)  # each child ended, exit status 0
    assert [marker.read_text() for marker in markers] == ["started"] * CHILDREN


@ONE_PROCESS_OR_A_FILE
def test_a_forked_child_does_not_wait_for_its_parents_queue(
    any_backend: ContractBackend, key: str, tmp_path: Path
) -> None:
    # The parent's notifier is stuck in a receiver; the child, whose exit may
    # wait an hour, returns from main at once and must end.
    markers = _run(any_backend, key, "fork", tmp_path)
    assert [marker.read_text() for marker in markers] == ["child exited 0"] * CHILDREN
