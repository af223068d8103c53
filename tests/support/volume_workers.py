"""Processes that race for one key many times, recording when each held it.

Each critical section is timed by the *storage's* clock where there is one
(PostgreSQL's ``clock_timestamp()``, MySQL's ``SYSDATE(6)``, Redis's ``TIME``;
SQLite's clock is the host's): the entry is read after the lock was granted and the exit before it
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
_SERVER_TIME = {
    "postgresql": "SELECT EXTRACT(EPOCH FROM clock_timestamp())",
    "mysql": "SELECT UNIX_TIMESTAMP(SYSDATE(6))",  # SYSDATE: now, not the statement's start
}
_NOT_DURABLE = {"sqlite": "PRAGMA synchronous = OFF", "postgresql": "SET synchronous_commit = off"}


def storage_clock(kind: str, recipe: BackendRecipe) -> Callable[[], float]:
    """A function reading the storage's clock, in seconds."""
    if kind == "redis":
        import redis

        client = redis.Redis.from_url(recipe.kwargs["url"])

        def redis_time() -> float:
            seconds, micros = client.time()
            return seconds + micros / 1e6

        return redis_time
    if kind in _SERVER_TIME:
        from django.db import connections

        alias, query = recipe.kwargs.get("using", "default"), _SERVER_TIME[kind]

        def server_time() -> float:
            with connections[alias].cursor() as cursor:
                cursor.execute(query)
                return float(cursor.fetchone()[0])

        return server_time
    return time.time  # SQLite: the host's clock is the storage's


def race(
    recipe: BackendRecipe,
    clock_kind: str,
    key: str,
    attempts: int,
    barrier: Barrier,
    results: Queue[dict[str, Any]],
    durable: bool = True,
) -> None:
    """Make ``attempts`` acquisitions of ``key``; report intervals held and errors seen.

    ``durable=False`` turns SQLite's ``synchronous`` (PostgreSQL's
    ``synchronous_commit``) off for this process's connection: commits skip
    the wait for the disk flush, which changes what survives a power cut but
    nothing about who holds the lock, and makes thousands of acquisitions
    affordable in a test run.
    """
    report: dict[str, Any] = {"pid": os.getpid(), "held": [], "refused": 0, "errors": []}
    try:
        from django_tasklock.api.service import TaskLockService

        service = TaskLockService(recipe.build())
        if not durable and clock_kind in _NOT_DURABLE:
            from django.db import connections

            with connections[recipe.kwargs.get("using", "default")].cursor() as cursor:
                cursor.execute(_NOT_DURABLE[clock_kind])
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


def race_cluster(
    url: str,
    keys: list[str],
    per_key: int,
    barrier: Barrier,
    results: Queue[dict[str, Any]],
) -> None:
    """``per_key`` acquisitions of each of ``keys`` in turn, in step with the other processes.

    Every process takes the keys in the same order, and ``barrier`` starts
    each key's turn in all of them at once, so that they fight over that
    key. Each interval is timed by the clock of the master holding that
    key's lease (``TIME``); ``held`` maps each key to its intervals,
    ``refused`` each key to the acquisitions of it refused here.
    """
    report: dict[str, Any] = {"pid": os.getpid(), "held": {}, "refused": {}, "errors": []}
    try:
        import django
        from django.conf import settings

        from django_tasklock.api.service import TaskLockService
        from django_tasklock.backends.base import storage_key
        from django_tasklock.backends.redis import RedisBackend
        from django_tasklock.backends.redis.urls import client_from_url

        if not settings.configured:
            settings.configure(USE_TZ=True, INSTALLED_APPS=["django_tasklock"])
            django.setup()
        service = TaskLockService(RedisBackend(url=url))
        client: Any = client_from_url(url)
        nodes = {key: client.get_node_from_key(storage_key(key)).redis_connection for key in keys}
        held: dict[str, list[Interval]] = report["held"]
        refused: dict[str, int] = report["refused"]

        def clock(key: str) -> float:
            seconds, micros = nodes[key].time()
            return float(seconds + micros / 1e6)

        for key in keys:
            barrier.wait(60)

            def work(key: str = key) -> None:
                entry = clock(key)
                held.setdefault(key, []).append((entry, clock(key)))

            for _ in range(per_key):
                try:
                    if not service.run_exclusive(key, work, ttl=30).acquired:
                        refused[key] = refused.get(key, 0) + 1
                except Exception as exc:  # every error is reported, none hidden as "held"
                    report["errors"].append(f"{type(exc).__name__}: {exc}")
    except BaseException:
        report["errors"].append(traceback.format_exc())
    results.put(report)
