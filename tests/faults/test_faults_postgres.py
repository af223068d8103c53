"""PostgreSQL faults while a lock is held: killed connections, restarts, the database down.

Restarts and outages happen on a private PostgreSQL (``tests/support/servers.py``) that
the holder, another process, reaches; the shared test server is never stopped.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import pytest
from django.db import connections

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.testing import BackendRecipe
from django_tasklock.testing.faults import FaultyBackend
from django_tasklock.testing.support import wait_until
from tests.conftest import require_service
from tests.support import services
from tests.support.fault_workers import hold_through, migrate
from tests.support.servers import PrivatePostgres, private_postgres

pytestmark = pytest.mark.slow
CTX = multiprocessing.get_context("spawn")


@pytest.fixture(scope="module")
def private_pg() -> Iterator[tuple[PrivatePostgres, BackendRecipe]]:
    with private_postgres() as server:
        recipe = BackendRecipe(
            backend="django_tasklock.backends.database.DatabaseBackend",
            settings={
                "DATABASES": {"default": services.postgres_settings(server.url)},
                "INSTALLED_APPS": ["django_tasklock"],
            },
        )
        proc = CTX.Process(target=migrate, args=(recipe,))
        proc.start()
        proc.join(120)
        assert proc.exitcode == 0
        yield server, recipe


def _holder(recipe: BackendRecipe, key: str, ttl: float, interval: float) -> Any:
    ours, theirs = CTX.Pipe()
    proc = CTX.Process(target=hold_through, args=(recipe, key, ttl, interval, theirs))
    proc.start()
    assert ours.poll(60), "the holder never reported"
    return proc, ours


def _outcome(proc: BaseProcess, conn: Connection) -> dict[str, Any]:
    assert conn.poll(60), "the holder never finished"
    outcome: dict[str, Any] = conn.recv()
    proc.join(10)
    return outcome


def _sql(server: PrivatePostgres, query: str) -> str:
    done = subprocess.run(
        ["psql", server.url, "-tAc", query], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _live(server: PrivatePostgres, key: str) -> bool:
    query = (
        f"SELECT count(*) FROM cache_entries WHERE key = 'task-lock:{key}' AND expires_at > now()"
    )
    return _sql(server, query) == "1"


def test_restart_shorter_than_the_lease_keeps_the_lock(
    private_pg: tuple[PrivatePostgres, BackendRecipe], key: str
) -> None:
    server, recipe = private_pg
    proc, conn = _holder(recipe, key, ttl=10, interval=1)
    assert conn.recv() == "holding"
    server.stop("fast")
    time.sleep(1.5)
    server.start()
    time.sleep(3)  # refreshes after the restart, on new connections
    assert _live(server, key)
    conn.send("done")
    outcome = _outcome(proc, conn)
    assert outcome["acquired"]
    assert outcome["result"] == "the work's result"
    assert not outcome["lost"], outcome["log"]
    assert not _live(server, key)


def test_database_down_at_release_keeps_the_result_and_the_lease_expires(
    private_pg: tuple[PrivatePostgres, BackendRecipe], key: str
) -> None:
    server, recipe = private_pg
    ttl = 3.0
    proc, conn = _holder(recipe, key, ttl=ttl, interval=1)
    assert conn.recv() == "holding"
    server.stop("fast")
    try:
        conn.send("done")
        outcome = _outcome(proc, conn)
    finally:
        server.start()
    assert outcome["acquired"]
    assert outcome["result"] == "the work's result"
    assert any("will expire by itself" in line for line in outcome["log"]), outcome["log"]
    deadline = time.monotonic() + ttl + 2
    while _live(server, key):
        assert time.monotonic() < deadline, "the lease outlived its ttl"
        time.sleep(0.2)


def test_database_down_at_acquisition_is_an_error_not_held(
    private_pg: tuple[PrivatePostgres, BackendRecipe], key: str
) -> None:
    server, recipe = private_pg
    server.stop("fast")
    try:
        proc, conn = _holder(recipe, key, ttl=3, interval=1)
        outcome = _outcome(proc, conn)
    finally:
        server.start()
    assert "acquired" not in outcome
    assert outcome["error"].startswith("OperationalError")


@pytest.mark.databases
def test_terminated_connection_is_replaced_and_the_lock_kept(key: str) -> None:
    require_service("postgres")
    backend = FaultyBackend(DatabaseBackend(using="postgres"))  # counts the refreshes answered

    def work() -> int:
        wait_until(lambda: backend.refresh_answers >= 1, timeout=30)  # the heartbeat connected
        with connections["postgres"].cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            killed = len(cursor.fetchall())
        answered = backend.refresh_answers
        # A refresh (or the reap) meets the dead connection; a later one reconnects.
        wait_until(lambda: backend.refresh_answers > answered, timeout=30)
        held = backend.peek(key)
        assert held is not None
        assert held.holder.pid == os.getpid()
        return killed

    result = TaskLockService(backend).run_exclusive(key, work, ttl=5.0, refresh_interval=0.3)
    assert result.result is not None
    assert result.result >= 1, "no connection of the heartbeat was terminated"
    assert not result.lost


@pytest.mark.databases
def test_ten_thousand_cycles_keep_connections_within_baseline_plus_one(key: str) -> None:
    require_service("postgres")
    service = TaskLockService(DatabaseBackend(using="postgres"))

    def connections_now() -> int:
        with connections["postgres"].cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            )
            return int(cursor.fetchone()[0])

    baseline = connections_now()
    with connections["postgres"].cursor() as cursor:
        # Commits stop waiting for the disk flush: who holds what is unchanged.
        cursor.execute("SET synchronous_commit = off")

    def cycles() -> int:
        peak = 0
        for i in range(10_000):
            service.run_exclusive(f"{key}-{i % 50}", lambda: None, ttl=30)
            if i % 250 == 0:
                peak = max(peak, connections_now())
        return peak

    # A lock held throughout keeps the heartbeat refreshing while the cycles run.
    result = service.run_exclusive(key, cycles, ttl=2, refresh_interval=0.2)
    assert not result.lost
    assert result.result is not None
    assert result.result <= baseline + 1
