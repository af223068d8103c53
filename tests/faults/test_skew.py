"""Workers with skewed clocks (libfaketime) cannot steal a live lock or keep a dead one.

Expiry is judged by the storage's clock (PostgreSQL, MySQL/MariaDB, Redis), so
a worker two hours ahead or behind changes nothing. SQLite has no server: its
clock is the host's, shared by every worker on that one host.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from django_tasklock.api.service import new_token
from django_tasklock.testing import ContractBackend
from tests.support.servers import require_binary

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server_clock_backend(any_backend: ContractBackend) -> ContractBackend:
    if any_backend.name in {"memory", "database:sqlite"}:
        pytest.skip(f"{any_backend.name}: no server clock (one host)")
    return any_backend


def _skewed(backend: ContractBackend, offset: str, key: str, action: str, ttl: float) -> Any:
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))
    library = require_binary(str(found[0]) if found else None, "faketime (libfaketime)")
    assert backend.recipe is not None
    spec = {"recipe": dataclasses.asdict(backend.recipe), "key": key, "action": action, "ttl": ttl}
    # libfaketime itself, not the faketime command, which would outlive a kill of it.
    env = {**os.environ, "LD_PRELOAD": library, "FAKETIME": offset, "DONT_FAKE_MONOTONIC": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.skew_worker", json.dumps(spec)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_worker_two_hours_ahead_cannot_take_a_live_lock(
    server_clock_backend: ContractBackend, key: str
) -> None:
    backend = server_clock_backend.backend
    token = new_token()
    assert backend.acquire(key, token, ttl=timedelta(seconds=30), max_lifetime=timedelta(hours=1))
    ahead = _skewed(server_clock_backend, "+2h", key, "try", 30)
    out, _ = ahead.communicate(timeout=60)  # reads and closes the pipe
    assert out.strip() == "refused"
    assert backend.release(key, token)


def test_worker_two_hours_behind_that_is_killed_is_reclaimed_on_time(
    server_clock_backend: ContractBackend, key: str
) -> None:
    backend, ttl = server_clock_backend.backend, 2.0
    behind = _skewed(server_clock_backend, "-2h", key, "hold", ttl)
    try:
        assert behind.stdout is not None
        assert behind.stdout.readline().strip() == "acquired"
        acquired_by = time.monotonic()
    finally:
        behind.kill()
        behind.communicate(timeout=10)
    life = timedelta(hours=1)
    attempts = []
    while True:
        now = time.monotonic() - acquired_by
        if backend.acquire(key, new_token(), ttl=timedelta(seconds=30), max_lifetime=life):
            break
        attempts.append(now)
        assert now < ttl + 1.0, "the lease of a worker 2 h behind outlived its ttl"
        time.sleep(0.05)
    assert ttl - 0.5 <= time.monotonic() - acquired_by <= ttl + 1.0
    assert attempts, "the key was free at once"
