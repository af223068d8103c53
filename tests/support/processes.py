"""Worker processes (Celery, ``db_worker``) started by the tests, as a user would run them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.support import services

ROOT = Path(__file__).resolve().parents[2]


def require_module(name: str) -> None:
    """Skip when an optional test dependency is missing, except under CI=true."""
    import importlib.util

    if importlib.util.find_spec(name) is None:
        reason = f"{name} is not installed (pip install -e '.[test]')"
        if services.IN_CI:
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)


def redis_url() -> str:
    """The Redis server of the tests' brokers (skip without one, except under CI=true)."""
    url = os.environ.get(services.REDIS_ENV)
    if not url:
        reason = f"Redis not available: set {services.REDIS_ENV} (e.g. redis://127.0.0.1:6379/15)"
        if services.IN_CI:
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    return url


@contextlib.contextmanager
def worker(
    args: Sequence[str], env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``python -m <args>`` from the repository root until the block ends.

    Stopped with SIGTERM (a worker's warm shutdown), then killed if it lingers;
    then whatever it started and left behind is killed too (it runs in a
    process group of its own: the children of a worker killed mid-task would
    go on holding keys and connections). Its output goes to ``log``, printed
    when the block fails.
    """
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield process
        except BaseException:
            print(f"--- output of {' '.join(args)} ---\n{log.read_text(errors='replace')}")
            raise
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
