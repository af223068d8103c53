"""Code the contract suite runs in other processes (started with ``spawn``).

A child process knows nothing of the parent's Django setup: it receives a
:class:`BackendRecipe` (settings and a backend class) and builds the same
backend against the same storage.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from queue import Queue
from typing import Any

from django_tasklock.backends.base import BaseBackend


@dataclasses.dataclass(frozen=True)
class BackendRecipe:
    """How another process builds a backend on the same storage.

    ``settings`` are passed to ``settings.configure()`` in the child (for the
    database backend: ``DATABASES`` naming the test database and
    ``INSTALLED_APPS`` with ``django_tasklock``); ``backend`` is the dotted
    path of the backend class, built with ``kwargs``.
    """

    backend: str
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)

    def build(self) -> BaseBackend:
        import django
        from django.conf import settings
        from django.utils.module_loading import import_string

        if not settings.configured:
            settings.configure(**{"USE_TZ": True, **self.settings})
            django.setup()
        backend: BaseBackend = import_string(self.backend)(**self.kwargs)
        return backend


def contend(
    recipe: BackendRecipe,
    key: str,
    seconds: float,
    hold: float,
    barrier: Barrier,
    results: Queue[tuple[int, list[tuple[float, float]], int]],
) -> None:
    """Race for ``key`` for ``seconds`` or more; report the intervals during which we held it.

    The interval is taken inside the work, after acquisition and before
    release, on the host's monotonic clock (shared by its processes): two
    intervals that overlap prove two holders at once.
    """
    from django_tasklock.api.service import TaskLockService

    service = TaskLockService(recipe.build())
    held: list[tuple[float, float]] = []
    refused = 0

    def work() -> None:
        start = time.monotonic()
        time.sleep(hold)
        held.append((start, time.monotonic()))

    barrier.wait()
    # Race for ``seconds``, and on a slow machine longer (up to ten times),
    # until this process has held the key a few times: the suite needs
    # contention it can see, not a throughput this machine may not reach.
    start = time.monotonic()
    end, hard_end = start + seconds, start + 10 * seconds
    while time.monotonic() < end or (len(held) < 4 and time.monotonic() < hard_end):
        if not service.run_exclusive(key, work, ttl=10).acquired:
            refused += 1
            time.sleep(random.uniform(0, hold / 2))
    results.put((os.getpid(), held, refused))


def contend_for_permits(
    recipe: BackendRecipe,
    key: str,
    limit: int,
    seconds: float,
    hold: float,
    barrier: Barrier,
    results: Queue[tuple[int, list[tuple[float, float, str]], int]],
) -> None:
    """:func:`contend` for one of ``key``'s ``limit`` permits, through the backend.

    Reports each hold as (start, end, the permit's name), taken after the
    acquisition and before the release on the host's monotonic clock: more
    than ``limit`` intervals overlapping at once, or two of one name, prove
    a permit given too many times.
    """
    from datetime import timedelta

    from django_tasklock.leases.tokens import new_token

    backend = recipe.build()
    ttl, life = timedelta(seconds=10), timedelta(hours=1)
    held: list[tuple[float, float, str]] = []
    refused = 0
    barrier.wait()
    start = time.monotonic()
    end, hard_end = start + seconds, start + 10 * seconds
    while time.monotonic() < end or (len(held) < 4 and time.monotonic() < hard_end):
        token = new_token()
        name = backend.acquire_permit(key, token, limit=limit, ttl=ttl, max_lifetime=life)
        if name is None:
            refused += 1
            time.sleep(random.uniform(0, hold / 2))
            continue
        began = time.monotonic()
        time.sleep(hold)
        held.append((began, time.monotonic(), name))
        backend.release(name, token)
    backend.close()
    results.put((os.getpid(), held, refused))


def hold_until_killed(
    recipe: BackendRecipe,
    key: str,
    ttl: float,
    refresh_interval: float,
    conn: Connection,
    provable: bool = True,
) -> None:
    """Acquire ``key``, say so through ``conn``, then work until killed.

    ``provable=False``: with tokens that carry no proof of this process, as
    an older version's, or a machine's without ``/proc``: once it is killed,
    nobody can prove it gone, and only its ttl frees the key.
    """
    if not provable:
        from django_tasklock import processes

        processes.mark = lambda: ""  # read by the first token made here
    from django_tasklock.api.service import TaskLockService

    service = TaskLockService(recipe.build())

    def work() -> None:
        conn.send(("acquired", os.getpid()))
        while True:
            time.sleep(1)

    result = service.run_exclusive(key, work, ttl=ttl, refresh_interval=refresh_interval)
    conn.send(("not acquired", result.acquired))  # pragma: no cover - only when the test fails


def fenced_write(path: str, fence: int, value: str) -> bool:
    """A resource protected by fencing tokens: a file that keeps the last fence it saw.

    A write is accepted only with a fence above every fence seen before, the
    check and the write made under an exclusive ``flock`` (as a database would
    with ``UPDATE ... WHERE last_fence < fence``).
    """
    import fcntl

    with open(path, "a+") as resource:
        fcntl.flock(resource, fcntl.LOCK_EX)
        resource.seek(0)
        last = resource.read().split()
        if last and fence <= int(last[0]):
            return False
        resource.seek(0)
        resource.truncate()
        resource.write(f"{fence} {value}")
        return True


def hold_fenced(
    recipe: BackendRecipe,
    key: str,
    ttl: float,
    refresh_interval: float,
    resource: str,
    conn: Connection,
) -> None:
    """Hold ``key`` with a fence, report it, and write to ``resource`` when told to."""
    from django_tasklock.api.service import TaskLockService

    service = TaskLockService(recipe.build())
    lock = service.lock(key, ttl=ttl, refresh_interval=refresh_interval, fencing=True)
    with lock:
        conn.send(("fenced", lock.fence))
        conn.recv()  # the parent's go, given after it stopped and resumed us
        assert lock.fence is not None
        conn.send(("wrote", fenced_write(resource, lock.fence, "stale")))
