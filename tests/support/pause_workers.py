"""A holder that checks ``lost`` in a tight loop while its parent pauses it (SIGSTOP)."""

from __future__ import annotations

import time
from multiprocessing.connection import Connection

from django_tasklock.testing import BackendRecipe


def check_through_a_pause(
    recipe: BackendRecipe, key: str, ttl: float, interval: float, conn: Connection
) -> None:
    """Hold ``key`` and read ``lock.lost`` every ~0.5 ms.

    After the first gap longer than ``ttl`` between two reads (the pause),
    report what the first read after it said, how many reads said False
    after it, and when (``clock()``) the loss was declared relative to it.
    """
    from django_tasklock.api.service import TaskLockService
    from django_tasklock.leases.lease import clock

    service = TaskLockService(recipe.build())
    with service.lock(key, ttl=ttl, refresh_interval=interval) as lock:
        assert lock._lease is not None
        declared: list[float] = []
        lock._lease.on_loss(lambda lease: declared.append(clock()))
        conn.send("holding")
        previous = clock()
        while True:
            now = clock()
            lost = lock.lost
            if now - previous > ttl:
                break
            previous = now
            time.sleep(0.0005)
        first_after = lost
        false_after = 0
        while not lock.lost:
            false_after += 1
            time.sleep(0.0005)
        conn.send(
            {
                "first_check_after_resume": first_after,
                "false_checks_after_resume": false_after,
                "declared_after_resume": declared[0] - now if declared else None,
            }
        )
        conn.recv()
