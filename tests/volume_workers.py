"""Processes that race for one key many times, recording when each held it.

Each critical section is timed by the *storage's* clock where there is one
(PostgreSQL's ``clock_timestamp()``, Redis's ``TIME``; SQLite's clock is the
host's): the entry is read after the lock was granted and the exit before it
is released, so each recorded interval lies inside a real holding interval,
and any two that overlap prove two holders at once.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from multiprocessing.synchronize import Barrier
from queue import Queue
from typing import Any

from django_tasklock.testing import BackendRecipe

Interval = tuple[float, float]


def storage_clock(kind: str, recipe: BackendRecipe) -> Callable[[], float]:
    """A function reading the storage's clock, in seconds."""
    if kind == "redis":
        import redis

        client = redis.Redis.from_url(recipe.kwargs["url"])

        def redis_time() -> float:
            seconds, micros = client.time()
            return seconds + micros / 1e6

        return redis_time
    if kind == "postgresql":
        from django.db import connections

        alias = recipe.kwargs.get("using", "default")

        def pg_time() -> float:
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())")
                return float(cursor.fetchone()[0])

        return pg_time
    return time.time  # SQLite: the host's clock is the storage's


def race(
    recipe: BackendRecipe,
    clock_kind: str,
    key: str,
    attempts: int,
    barrier: Barrier,
    results: Queue[dict[str, Any]],
) -> None:
    """Make ``attempts`` acquisitions of ``key``; report intervals held and errors seen."""
    report: dict[str, Any] = {"pid": os.getpid(), "held": [], "refused": 0, "errors": []}
    try:
        from django_tasklock.service import TaskLockService

        service = TaskLockService(recipe.build())
        clock = storage_clock(clock_kind, recipe)
        held: list[Interval] = report["held"]

        def work() -> None:
            entry = clock()
            held.append((entry, clock()))

        barrier.wait()
        for _ in range(attempts):
            try:
                if not service.run_exclusive(key, work, ttl=30).acquired:
                    report["refused"] += 1
            except Exception as exc:  # every error is reported, none hidden as "held"
                report["errors"].append(f"{type(exc).__name__}: {exc}")
    except BaseException:
        report["errors"].append(traceback.format_exc())
    results.put(report)


def overlaps(intervals: list[Interval]) -> list[tuple[Interval, Interval]]:
    """Pairs of consecutive intervals (by entry) where the later starts before the earlier ends."""
    ordered = sorted(intervals)
    found = []
    latest_end, latest = float("-inf"), None
    for interval in ordered:
        if interval[0] < latest_end and latest is not None:
            found.append((latest, interval))
        if interval[1] > latest_end:
            latest_end, latest = interval[1], interval
    return found
