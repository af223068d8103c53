"""What the scheduler-leader tests share: where the lock lives, the recorded runs, the verdict.

Each test runs three scheduler processes whose one job is due every whole
second; every run is recorded in a Redis list as ``"<due second> <pid> <ran at>"``.
Halfway the leader is killed with SIGKILL.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Callable

import pytest
from django.db import connections

from tests import services

#: How long each run lasts: 2 minutes of a 1 s schedule (the APScheduler test half of it).
SECONDS = float(os.environ.get("TASKLOCK_TEST_LEADER_SECONDS", "120"))
TTL = 6.0
RETRY = 0.5  # the standbys' retry_interval
#: Room for a loaded machine on top of the failover window.
SLACK = 4.0

Run = tuple[int, int, float]  # (due second, pid, when)


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


def read_runs(client: object, name: str) -> list[Run]:
    runs = []
    for raw in client.lrange(name, 0, -1):  # type: ignore[attr-defined]
        due, pid, when = raw.decode().split()
        runs.append((int(due), int(pid), float(when)))
    return runs


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
    excused: set[int] = frozenset(),  # type: ignore[assignment]
) -> None:
    """Each second once at most; one process before the kill, another after; a short gap.

    ``stopped``: when the test began stopping the processes.

    No second is missing except in the failover window (after the killed
    leader's last run, before its successor's first) and in ``excused``.
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
    assert first_after - killed <= TTL + RETRY + 1 + SLACK, (
        f"the standby's first run was due {first_after - killed:.1f} s after the kill"
    )
    window = set(range(max(due for due, _, _ in before) + 1, first_after))
    expected = set(range(min(due for due, _, _ in runs), math.floor(stopped) - 2))
    lost = expected - {due for due, _, _ in runs} - window - excused
    assert not lost, f"seconds run by nobody outside the failover window: {sorted(lost)}"
