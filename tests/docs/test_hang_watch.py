"""A hung test ends the run within the watchdog's time, naming where it hung."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import tests.conftest
from tests.support.services import child_env

ROOT = Path(__file__).resolve().parents[2]

HANGS = """
import threading


def test_waits_for_a_lock_nobody_releases():
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()
"""


def test_the_suite_runs_under_the_hang_watchdog() -> None:
    assert "tests.support.hangs" in tests.conftest.pytest_plugins


def test_a_hung_test_ends_its_run_with_every_threads_stack(tmp_path: Path) -> None:
    (tmp_path / "test_hung.py").write_text(HANGS)
    started = time.monotonic()
    run = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "tests.support.hangs", "-p", "xdist"),
            *("-p", "no:cacheprovider", "-n", "1", "-q", "--rootdir", str(tmp_path)),
            str(tmp_path / "test_hung.py"),
        ],
        cwd=ROOT,
        env={**child_env(), "TASKLOCK_TEST_HUNG_AFTER": "3", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode != 0
    assert time.monotonic() - started < 120
    assert "Timeout (0:00:03)!" in run.stderr, run.stderr
    assert "test_waits_for_a_lock_nobody_releases" in run.stderr, run.stderr
    assert "crashed" in run.stdout, run.stdout
