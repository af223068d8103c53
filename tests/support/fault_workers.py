"""Lock holders run in other processes by the fault tests (started with ``spawn``).

Each builds its backend from a :class:`BackendRecipe`, reports through a pipe,
and lets the parent break the storage in between.
"""

from __future__ import annotations

import logging
import time
from multiprocessing.connection import Connection
from typing import Any

from django_tasklock.testing import BackendRecipe


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def migrate(recipe: BackendRecipe) -> None:
    recipe.build()
    from django.core.management import call_command

    call_command("migrate", "django_tasklock", verbosity=0)


def hold_through(
    recipe: BackendRecipe, key: str, ttl: float, interval: float, conn: Connection
) -> None:
    """Hold ``key`` until the parent says "done"; report the outcome and the log.

    The parent breaks and mends the storage while we hold the lock, then reads
    ``{"acquired", "result", "lost", "log", "lost_signals"}`` back.
    """
    from django_tasklock.api.service import TaskLockService
    from django_tasklock.signals import lock_lost

    service = TaskLockService(recipe.build())
    logs = _Collect()
    logging.getLogger("django_tasklock").addHandler(logs)
    lost_signals: list[str] = []
    lock_lost.connect(lambda sender, key, **kw: lost_signals.append(key), weak=False)

    def work() -> str:
        conn.send("holding")
        while conn.recv() != "done":
            pass
        return "the work's result"

    outcome: dict[str, Any] = {}
    try:
        result = service.run_exclusive(key, work, ttl=ttl, refresh_interval=interval)
        outcome = {"acquired": result.acquired, "result": result.result, "lost": result.lost}
    except Exception as exc:
        outcome = {"error": f"{type(exc).__name__}: {exc}"}
    outcome["log"] = logs.lines
    outcome["lost_signals"] = lost_signals
    conn.send(outcome)
    time.sleep(0.2)


def hold_two(recipe: BackendRecipe, key: str, conn: Connection) -> None:
    """Hold ``key-short`` (refreshed every 0.5 s) and ``key-long`` (every 20 s) until
    the long one is lost or the parent says "done"; report when and why it was lost.

    The parent steps the storage's clock meanwhile (``tests/faults/test_storage_clock.py``).
    """
    from django_tasklock.api.service import TaskLockService
    from django_tasklock.leases.lease import clock

    service = TaskLockService(recipe.build())
    short = service.lock(f"{key}-short", ttl=2, refresh_interval=0.5)
    long = service.lock(f"{key}-long", ttl=60, refresh_interval=20)
    with short, long:
        end = clock() + 5
        while short._lease is not None and short._lease.answered_at == short._lease.asked_at:
            if clock() > end:
                break
            time.sleep(0.05)
        conn.send("holding")
        lost_at = None
        while not conn.poll(0.02):
            if lost_at is None and long.lost:
                lost_at = clock()
                conn.send(
                    {"lost_at": lost_at, "reason": long._lease.reason if long._lease else None}
                )
        conn.recv()
