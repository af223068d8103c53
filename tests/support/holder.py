"""A process that holds a lock until it finds it lost (started with ``spawn``).

Kept apart from the test modules so that the child imports nothing that needs
Django set up before :meth:`BackendRecipe.build` has configured it.
"""

from __future__ import annotations

import os
import threading
from multiprocessing.connection import Connection

from django_tasklock.testing.workers import BackendRecipe


def hold_until_lost(recipe: BackendRecipe, key: str, conn: Connection) -> None:
    """Hold ``key`` until the heartbeat finds the lease gone; report ``result.lost``."""
    from django_tasklock.api.service import TaskLockService
    from django_tasklock.signals import lock_lost

    service = TaskLockService(recipe.build())
    lost = threading.Event()
    lock_lost.connect(lambda **kwargs: lost.set(), weak=False)

    def work() -> None:
        conn.send(("acquired", os.getpid()))
        lost.wait(120)

    result = service.run_exclusive(key, work, ttl=30, refresh_interval=0.5)
    conn.send(("finished", result.lost))


def hold_on_command(recipe: BackendRecipe, key: str, conn: Connection, limit: int = 1) -> None:
    """Hold ``key`` (an hour's lease); on "release" or "force", end it so; then wait.

    "force": an operator's force release, from this process too. With
    ``limit`` of 2 or more, every permit of the key is held, and one is ended.
    """
    from django_tasklock.api.service import TaskLockService
    from django_tasklock.backends.base import permit_key

    backend = recipe.build()
    service = TaskLockService(backend)
    locks = [service.lock(key, ttl=3600, limit=limit) for _ in range(limit)]
    for lock in locks:
        lock.acquire()
    conn.send("acquired")
    lock = locks[0]
    if conn.recv() == "release":
        lock.release()
    else:
        name = key if lock.permit is None else permit_key(key, lock.permit)
        assert backend.force_release(name) is not None
    conn.send("ended")
    conn.recv()  # until the test is done
