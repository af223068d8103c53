"""What the scheduler-leader tests share: where the lock lives, the recorded runs, the verdict.

Each test runs three scheduler processes whose one job is due every whole
second; every run is recorded in a Redis list as ``"<due second> <pid> <ran at>"``
(Celery beat adds its look at the leadership, see ``tests.jobs.celery_beat``).
Halfway the leader is killed with SIGKILL; the test reads, from the lock's
storage, when the killed leader's lease ended and when its successor's began.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

import pytest
from django.db import connections

from django_tasklock.backends.base import BaseBackend, HeldLock
from tests.support import services

#: How long each run lasts: 2 minutes of a 1 s schedule.
SECONDS = float(os.environ.get("TASKLOCK_TEST_LEADER_SECONDS", "120"))
TTL = 6.0
RETRY = 0.5  # the standbys' retry_interval
#: The standby's own delays, which no setting bounds: how long one look (a
#: read of the key, then the write that takes it) and reading the clock after
#: it take, and how late its process gets a CPU on a busy machine. Allowed
#: twice: to take the key, then to fire. Measured twice on 2 cores at load 5-6,
#: both tests and both storages: none (the key taken 0.05-0.39 s after the
#: lease ended, within RETRY; the first run due 0.02-0.85 s after, within 1 s).
LATE = 1.0
#: Storage times are whole milliseconds (Redis): a lease's end and the next
#: one's start may round to 1 ms apart either way.
RESOLUTION = 0.002

Run = tuple[int, int, float]  # (due second, pid, when)


class Failover(NamedTuple):
    """What the lock's storage says about the leader's death, by the storage's clock."""

    lease_end: float  # when the killed leader's lease ended (epoch seconds)
    taken: float  # when the successor's lease began


def lock_store(store: str) -> dict[str, str]:
    """Environment naming where the processes keep the leadership: PostgreSQL or Redis."""
    url = services.service_url(
        store, services.POSTGRES_ENV if store == "postgres" else services.REDIS_ENV
    )
    if not url:
        reason = f"{store} is not available"
        if services.IN_CI:
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    env = {"TASKLOCK_TEST_LOCK_STORE": store}
    if store == "postgres":
        env["TASKLOCK_TEST_LOCK_DB"] = str(connections["postgres"].settings_dict["NAME"])
    return env


def storage(store: str) -> BaseBackend:
    """The backend the processes of ``lock_store(store)`` keep their leadership in."""
    if store == "postgres":
        from django_tasklock.backends.database import DatabaseBackend

        return DatabaseBackend(using="postgres")
    from django_tasklock.backends.redis import RedisBackend

    return RedisBackend(url=os.environ[services.REDIS_ENV])


def lease_of(backend: BaseBackend, key: str, pid: int) -> HeldLock:
    """The lease at ``key``, which process ``pid`` must hold."""
    held = backend.peek(key)
    assert held is not None, f"nobody holds {key!r}"
    assert held.holder.pid == pid, f"{key!r} is held by {held.holder}, not by pid {pid}"
    return held


def read_runs(client: object, name: str) -> list[Run]:
    return runs_of(read_fields(client, name))


def runs_of(fields: list[list[str]]) -> list[Run]:
    return [(int(due), int(pid), float(when)) for due, pid, when, *_ in fields]


def read_fields(client: object, name: str) -> list[list[str]]:
    """Every recorded run's fields, in the order recorded."""
    return [raw.decode().split() for raw in client.lrange(name, 0, -1)]  # type: ignore[attr-defined]


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout} s")
        time.sleep(0.2)


def check(
    runs: list[Run],
    *,
    pids: list[int],
    leader: int,
    killed: float,
    stopped: float,
    failover: Failover,
    excused: set[int] = frozenset(),  # type: ignore[assignment]
) -> str:
    """Each second once at most; one process before the kill, another after; a short gap.

    ``stopped``: when the test began stopping the processes. ``excused``:
    seconds the scheduler itself skipped (the caller says why).

    No second is missing except in the failover window (after the killed
    leader's last run, before its successor's first) and in ``excused``. The
    window: the killed leader's lease ends at most ``TTL`` after the kill; the
    successor takes the key after that, never before, and within ``RETRY``
    (its next look) plus its own delays (``LATE``); its first run is the next
    one due, at most 1 s later, plus its delays again. Returns what was measured.
    """
    doubled = {due: n for due, n in Counter(due for due, _, _ in runs).items() if n > 1}
    assert not doubled, f"seconds run more than once: {doubled}"
    before = [run for run in runs if run[2] < killed]
    # Until the test stops them: stopping, each process lets go, and another leads briefly.
    after = [run for run in runs if killed <= run[2] < stopped]
    assert {pid for _, pid, _ in before} == {leader}, "one process ran the job before the kill"
    successors = {pid for _, pid, _ in after}
    assert len(successors) == 1, f"one process ran the job after the kill: {successors}"
    assert successors != {leader}
    assert successors <= set(pids)
    first_after = min(due for due, _, _ in after)
    lease_end, taken = failover
    measured = (
        f"the lease ended {lease_end - killed:.3f} s after the kill, the successor took the "
        f"key {taken - lease_end:.3f} s after that, and its first run was due "
        f"{first_after - taken:.3f} s after it took the key"
    )
    assert lease_end - killed <= TTL + RESOLUTION, measured
    assert taken >= lease_end - RESOLUTION, f"taken before the lease ended: {measured}"
    assert taken - lease_end <= RETRY + LATE, measured
    assert first_after - taken <= 1 + LATE, measured
    window = set(range(max(due for due, _, _ in before) + 1, first_after))
    expected = set(range(min(due for due, _, _ in runs), math.floor(stopped) - 2))
    lost = expected - {due for due, _, _ in runs} - window - excused
    assert not lost, f"seconds run by nobody outside the failover window: {sorted(lost)}"
    return measured
