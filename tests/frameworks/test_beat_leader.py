"""One active ``celery beat`` among three: real beat processes, a real worker, RabbitMQ.

Three ``celery beat --scheduler django_tasklock.contrib.celery:LeaderScheduler``
processes run an entry due every whole second; a worker records each run (the
second it was due for, the beat that sent it, when, and that beat's look at its
leadership) in a Redis list. Halfway, the leader is killed with SIGKILL. Every
second is sent once at most; none is missing except in the failover window
(see ``leader_runs.check``), or where beat itself ran a tick a second or more
late: Celery asks a schedule once per tick whether it is due, so the seconds a
late tick missed become one run, as with any Celery schedule (see
``skipped_by_beat``: only within one beat's term, so the lock's doing, a term
that ends or begins, excuses nothing).

The run lasts ``TASKLOCK_TEST_LEADER_SECONDS`` (default 120 s) per lock storage.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connections

from tests.frameworks.test_celery import amqp_url
from tests.support import leader_runs, processes, services
from tests.support.leader_runs import (
    LATE,
    RETRY,
    SECONDS,
    TTL,
    Failover,
    lease_of,
    read_fields,
    read_runs,
    runs_of,
    wait_until,
)

pytestmark = [pytest.mark.databases, pytest.mark.slow]


def skipped_by_beat(fields: list[list[str]]) -> set[int]:
    """Seconds beat skipped itself: after a run it sent a second late or more, in one term.

    A tick late by a second or more (``sent``) finds the entry due once and
    sends one run, for the first second missed; the next is due after the
    tick. Only the seconds between that run and the next of the same beat and
    the same term (``leader_since``) are excused: a term's end, a takeover or
    a lost lease (the lock's doing) excuses none. A doubled second is caught
    before, whatever is excused.
    """
    runs = sorted((int(f[0]), int(f[1]), float(f[2]), float(f[5])) for f in fields)
    excused: set[int] = set()
    for (due, pid, sent, term), (next_due, next_pid, _, next_term) in itertools.pairwise(runs):
        if term and (pid, term) == (next_pid, next_term):
            excused.update(range(due + 1, min(math.floor(sent), next_due - 1) + 1))
    return excused


def lateness(fields: list[list[str]]) -> str:
    """Each run sent a second late or more: how late beat began its look, how long it took."""
    late = [
        f"{int(due)}: sent +{float(sent) - int(due):.2f} s, look began "
        f"+{float(looked) - int(due):.2f} s and took {float(look):.3f} s"
        for due, _, sent, looked, look, _ in fields
        if float(sent) - int(due) >= 1
    ]
    longest = max(float(look) for *_, look, _ in fields)
    return f"the longest look took {longest:.3f} s; {len(late)} runs sent late: " + "; ".join(late)


def test_a_late_tick_excuses_the_seconds_it_skipped_within_one_term_only() -> None:
    term, other = "1000.5", "1010.25"
    fields = [
        # 1001 sent 1.4 s late (the next due after the tick: 1003): 1002 excused.
        ["1001", "7", "1002.4", "1002.39", "0.002", term],
        ["1003", "7", "1003.01", "1003.0", "0.002", term],
        # Sent late, then the term ended (a lost lease): 1005-1006 are the lock's.
        ["1004", "7", "1005.2", "1005.19", "0.002", term],
        ["1007", "7", "1007.01", "1007.0", "0.002", other],
        # Sent late, then another beat: a takeover excuses nothing either.
        ["1008", "7", "1009.5", "1009.49", "0.002", other],
        ["1011", "8", "1011.01", "1011.0", "0.002", "1010.9"],
    ]
    assert skipped_by_beat(fields) == {1002}
    # Nor does an excused second hide one sent twice.
    twice = [(1001, 7, 1001.0), (1002, 7, 1002.0), (1002, 8, 1002.1)]
    with pytest.raises(AssertionError, match="more than once"):
        leader_runs.check(
            twice,
            pids=[7, 8],
            leader=7,
            killed=1001.5,
            stopped=1010.0,
            failover=Failover(1001.9, 1001.95),
            excused={1002},
        )


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
    backend = leader_runs.storage(store)
    key = env["TASKLOCK_TEST_BEAT_KEY"]
    try:
        with beats_and_worker(env, tmp_path) as pids:
            wait_until(lambda: client.llen(ticks_list) > 0, 90, "no run was recorded")
            time.sleep(SECONDS / 2)
            leader = read_runs(client, ticks_list)[-1][1]
            assert leader in pids
            os.kill(leader, signal.SIGKILL)
            killed = time.time()
            time.sleep(0.2)  # a refresh the leader had sent is answered, if it was
            lease_end = lease_of(backend, key, leader).expires_at.timestamp()
            time.sleep(max(SECONDS / 2, TTL + RETRY + 1 + 2 * LATE + 5))
            successor = read_runs(client, ticks_list)[-1][1]
            taken = lease_of(backend, key, successor).acquired_at.timestamp()
            stopped = time.time()
        # The beats have stopped, then the worker, once it had drained its queue.
        fields = read_fields(client, ticks_list)
    finally:
        client.delete(ticks_list)
        client.close()
        backend.close()

    ticks = runs_of(fields)
    excused = skipped_by_beat(fields)
    measured = leader_runs.check(
        ticks,
        pids=pids,
        leader=leader,
        killed=killed,
        stopped=stopped,
        failover=Failover(lease_end, taken),
        excused=excused,
    )
    print(f"{store}: {measured}; {len(excused)} seconds excused; {lateness(fields)}")
    assert len(ticks) >= SECONDS - (TTL + RETRY + 1 + 2 * LATE) - len(excused) - 5
