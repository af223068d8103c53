"""One active APScheduler 3 scheduler among three: real scheduler processes.

Three processes (``tests/jobs/apscheduler_leader.py``) run a job due every
whole second, each through ``django_tasklock.contrib.apscheduler.LeaderExecutor``;
each run is recorded with the second it was due for. Halfway, the leader is
killed with SIGKILL. Every second runs once at most, and none is missing except
in the failover window (see ``leader_runs.check``; the jobs do not coalesce and
may run up to a minute late, so a loaded machine loses no run).

The run lasts ``TASKLOCK_TEST_LEADER_SECONDS`` (default 120 s) per lock storage.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from django.db import connections

from tests.support import leader_runs, processes, services
from tests.support.leader_runs import (
    LATE,
    RETRY,
    SECONDS,
    TTL,
    Failover,
    lease_of,
    read_runs,
    wait_until,
)

pytestmark = [pytest.mark.databases, pytest.mark.slow]


@pytest.mark.parametrize("store", ["postgres", "redis"])
def test_three_schedulers_run_each_second_once_and_a_standby_takes_over_from_a_killed_leader(
    store: str, tmp_path: Path
) -> None:
    processes.require_module("apscheduler")
    import redis

    run = uuid.uuid4().hex[:8]
    runs_list = f"tasklock-apscheduler-tests:{run}:runs"
    env = {
        **leader_runs.lock_store(store),
        "DJANGO_SETTINGS_MODULE": "tests.jobs.lock_settings",
        "TASKLOCK_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
        "TASKLOCK_TEST_TICKS": runs_list,
        "TASKLOCK_TEST_BEAT_KEY": f"apscheduler-tests:{run}",
        "TASKLOCK_TEST_BEAT_TTL": str(TTL),
    }
    client = redis.Redis.from_url(os.environ[services.REDIS_ENV])
    backend = leader_runs.storage(store)
    key = env["TASKLOCK_TEST_BEAT_KEY"]
    try:
        with contextlib.ExitStack() as schedulers:
            pids = [
                schedulers.enter_context(
                    processes.worker(
                        ["tests.jobs.apscheduler_leader"], env, tmp_path / f"scheduler-{n}.log"
                    )
                ).pid
                for n in range(3)
            ]
            wait_until(lambda: client.llen(runs_list) > 0, 90, "no run was recorded")
            time.sleep(SECONDS / 2)
            leader = read_runs(client, runs_list)[-1][1]
            assert leader in pids
            os.kill(leader, signal.SIGKILL)
            killed = time.time()
            time.sleep(0.2)  # a refresh the leader had sent is answered, if it was
            lease_end = lease_of(backend, key, leader).expires_at.timestamp()
            time.sleep(max(SECONDS / 2, TTL + RETRY + 1 + 2 * LATE + 5))
            successor = read_runs(client, runs_list)[-1][1]
            taken = lease_of(backend, key, successor).acquired_at.timestamp()
            stopped = time.time()
        runs = read_runs(client, runs_list)
    finally:
        client.delete(runs_list)
        client.close()
        backend.close()

    measured = leader_runs.check(
        runs,
        pids=pids,
        leader=leader,
        killed=killed,
        stopped=stopped,
        failover=Failover(lease_end, taken),
    )
    print(f"{store}: {measured}")
