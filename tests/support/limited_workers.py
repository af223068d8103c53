"""Processes that contend for a ``limit=N`` key through the lock API (started with ``spawn``).

Each body records when it ran, on the host's monotonic clock (shared by its
processes), from inside the work: more than N intervals overlapping at one
instant prove more than N holders at once, whatever the storage said.
"""

from __future__ import annotations

import functools
import os
import random
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from queue import Queue
from typing import Any

from django_tasklock.backends.base import BaseBackend
from django_tasklock.testing.workers import BackendRecipe

#: What a contender reports: its pid, its bodies' (start, end), refusals, errors.
Report = tuple[int, list[tuple[float, float]], int, int]


def contend_limited(
    build: Callable[[], BaseBackend],
    key: str,
    limit: int,
    rounds: int,
    hold: float,
    barrier: Any,
    results: Queue[Report],
) -> None:
    """``rounds`` calls of ``run_exclusive(key, body, limit=limit)``; a refused one pauses.

    ``build`` makes the backend (a :class:`BackendRecipe`'s ``build`` in a
    process of its own). A call that raises (a reply lost through a fault
    proxy: the storage's error, never "held") is counted and the next round begins.
    """
    from django_tasklock.api.service import TaskLockService

    service = TaskLockService(build())
    held: list[tuple[float, float]] = []
    refused = errors = 0

    def body() -> None:
        began = time.monotonic()
        time.sleep(hold)
        held.append((began, time.monotonic()))

    barrier.wait()
    for _ in range(rounds):
        try:
            result = service.run_exclusive(key, body, limit=limit, ttl=2.0, refresh_interval=0.5)
        except Exception:  # a storage error: counted, the round is over
            errors += 1
            continue
        if not result.acquired:
            refused += 1
            time.sleep(random.uniform(0, hold))
    results.put((os.getpid(), held, refused, errors))


def hold_permit_until_killed(
    recipe: BackendRecipe, key: str, limit: int, conn: Connection
) -> None:
    """Take a permit of ``key`` with a long ttl, say when the body began, and run until killed."""
    from django_tasklock.api.service import TaskLockService

    service = TaskLockService(recipe.build())

    def body() -> None:
        conn.send(("began", time.monotonic()))
        while True:
            time.sleep(1)

    result = service.run_exclusive(key, body, limit=limit, ttl=60, refresh_interval=5)
    conn.send(("not acquired", result.acquired))  # pragma: no cover - only when the test fails


def cluster_through(ports: dict[int, int]) -> BaseBackend:
    """The Redis backend on a cluster each of whose nodes is reached through a proxy.

    ``ports``: each node's port -> its proxy's. The client is told the nodes'
    own addresses (``CLUSTER SLOTS``, redirects) and maps them to the proxies'
    (redis-py's ``address_remap``), so every request and reply passes a proxy.
    """
    from redis.cluster import ClusterNode, RedisCluster

    from django_tasklock.backends.redis import RedisBackend

    startup = [ClusterNode("127.0.0.1", proxy) for proxy in ports.values()]  # type: ignore[no-untyped-call]
    remap = functools.partial(_through, ports)
    return RedisBackend(client=RedisCluster(startup_nodes=startup, address_remap=remap))


def _through(ports: dict[int, int], address: tuple[str, int]) -> tuple[str, int]:
    return "127.0.0.1", ports.get(address[1], address[1])
