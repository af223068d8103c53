"""Processes for ``on_locked="rerun"`` across processes (started with ``spawn``).

Each builds its backend from a :class:`BackendRecipe` and reports over a Pipe.
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection

from django_tasklock.testing.workers import BackendRecipe


def mark_and_exit(recipe: BackendRecipe, key: str, conn: Connection) -> None:
    """``run_exclusive(key, ..., on_locked="rerun")`` once; send what it returned, then exit.

    The work, if this call ever took the key, says so: the test then fails.
    """
    from django.db import connections

    from django_tasklock.api.service import TaskLockService

    try:
        service = TaskLockService(recipe.build())
        result = service.run_exclusive(key, lambda: conn.send(("ran", None)), on_locked="rerun")
        conn.send(("result", (result.acquired, result.rerun)))
    finally:
        connections.close_all()
        conn.close()


def hold_with_rerun_until_killed(
    recipe: BackendRecipe, key: str, ttl: float, conn: Connection
) -> None:
    """Hold ``key`` in ``run_exclusive(..., on_locked="rerun", ttl=ttl)``; say when the
    work began, and run until killed."""
    from django_tasklock.api.service import TaskLockService

    service = TaskLockService(recipe.build())

    def work() -> None:
        conn.send(("began", None))
        while True:
            time.sleep(1)

    result = service.run_exclusive(key, work, on_locked="rerun", ttl=ttl)
    conn.send(("not acquired", result.acquired))  # pragma: no cover - only when the test fails
