"""One active ``celery beat`` among three: real beat processes, a real worker, RabbitMQ.

Three ``celery beat --scheduler django_tasklock.contrib.celery:LeaderScheduler``
processes run an entry due every whole second; a worker records each run (the
second it was due for, the beat that sent it, when) in a Redis list. Halfway,
the leader is killed with SIGKILL. Every second is sent once at most; none is
missing except in the failover window (the dead leader's lease running out,
``ttl``, plus a standby's look and one tick), or where beat itself was late by
a second or more (Celery collapses runs missed meanwhile into one, as it
always does; such seconds are named by the run sent late, see ``late``).

The run lasts ``TASKLOCK_TEST_LEADER_SECONDS`` (default 120 s) per lock storage.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connections

from tests import leader_runs, processes, services
from tests.leader_runs import RETRY, SECONDS, SLACK, TTL, Run, read_runs, wait_until
from tests.test_celery import amqp_url

pytestmark = [pytest.mark.databases, pytest.mark.slow]


def late(runs: list[Run]) -> set[int]:
    """Seconds no beat was due to send: beat sent the run before them a second late or more."""
    return {s for due, _, sent in runs for s in range(due + 1, math.floor(sent) + 1)}


@contextlib.contextmanager
def beats_and_worker(env: dict[str, str], folder: Path) -> Iterator[list[int]]:
    """A worker, then three beat processes (their pids yielded); beats stop first."""
    app = ["celery", "-A", "tests.jobs.celery_beat"]
    queue = env["TASKLOCK_TEST_CELERY_QUEUE"]
    worker_args = [
        *app, "worker", "--pool=solo", "--without-gossip", "--without-mingle",
        "--without-heartbeat", "--loglevel=WARNING", f"--hostname={queue}@%h",
    ]  # fmt: skip
    with processes.worker(worker_args, env, folder / "worker.log"):
        with contextlib.ExitStack() as beats:
            pids = []
            for number in range(3):
                beat_args = [
                    *app, "beat", "--scheduler", "django_tasklock.contrib.celery:LeaderScheduler",
                    f"--schedule={folder / f'schedule-{number}'}",
                    f"--pidfile={folder / f'beat-{number}.pid'}",
                    "--loglevel=INFO", "--max-interval=1",
                ]  # fmt: skip
                log = folder / f"beat-{number}.log"
                pids.append(beats.enter_context(processes.worker(beat_args, env, log)).pid)
            yield pids
        time.sleep(3)  # the worker drains its queue of the last runs sent


@pytest.mark.parametrize("store", ["postgres", "redis"])
def test_three_beats_send_each_second_once_and_a_standby_takes_over_from_a_killed_leader(
    store: str, tmp_path: Path
) -> None:
    processes.require_module("celery")
    import redis

    run = uuid.uuid4().hex[:8]
    ticks_list = f"tasklock-beat-tests:{run}:ticks"
    env = {
        **leader_runs.lock_store(store),
        "DJANGO_SETTINGS_MODULE": "tests.jobs.lock_settings",
        "TASKLOCK_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
        "TASKLOCK_TEST_AMQP_URL": amqp_url(),
        "TASKLOCK_TEST_CELERY_QUEUE": f"tasklock-beat-tests-{run}",
        "TASKLOCK_TEST_TICKS": ticks_list,
        "TASKLOCK_TEST_BEAT_KEY": f"beat-tests:{run}",
        "TASKLOCK_TEST_BEAT_TTL": str(TTL),
    }
    client = redis.Redis.from_url(os.environ[services.REDIS_ENV])
    try:
        with beats_and_worker(env, tmp_path) as pids:
            wait_until(lambda: client.llen(ticks_list) > 0, 90, "no run was recorded")
            time.sleep(SECONDS / 2)
            leader = read_runs(client, ticks_list)[-1][1]
            assert leader in pids
            os.kill(leader, signal.SIGKILL)
            killed = time.time()
            time.sleep(max(SECONDS / 2, TTL + RETRY + 1 + SLACK + 5))
            stopped = time.time()
        # The beats have stopped, then the worker, once it had drained its queue.
        ticks = read_runs(client, ticks_list)
    finally:
        client.delete(ticks_list)
        client.close()

    leader_runs.check(
        ticks, pids=pids, leader=leader, killed=killed, stopped=stopped, excused=late(ticks)
    )
    assert len(ticks) >= SECONDS - TTL - SLACK - len(late(ticks)) - 5
