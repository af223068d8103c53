"""An APScheduler 3 scheduler process with a job due every whole second (``python -m``).

The test starts three of these. Each wraps its executor in ``LeaderExecutor``;
each run of the job is recorded, in a Redis list of the test's, with the second
it was due for, the process that ran it and when.
"""

from __future__ import annotations

import os
import time
from typing import Any

import django

django.setup()

import redis  # noqa: E402
from apscheduler.events import EVENT_JOB_EXECUTED  # noqa: E402
from apscheduler.executors.pool import ThreadPoolExecutor  # noqa: E402
from apscheduler.schedulers.blocking import BlockingScheduler  # noqa: E402

from django_tasklock.contrib.apscheduler import LeaderExecutor  # noqa: E402

TICKS = os.environ["TASKLOCK_TEST_TICKS"]
client = redis.Redis.from_url(os.environ["TASKLOCK_TEST_REDIS_URL"])


def tick() -> None:
    """The job: its runs are recorded by ``record`` (which knows when each was due)."""


def record(event: Any) -> None:
    due = int(event.scheduled_run_time.timestamp())
    client.rpush(TICKS, f"{due} {os.getpid()} {time.time():.3f}")


def main() -> None:
    executor = LeaderExecutor(
        ThreadPoolExecutor(2),
        os.environ["TASKLOCK_TEST_BEAT_KEY"],
        ttl=float(os.environ["TASKLOCK_TEST_BEAT_TTL"]),
        retry_interval=0.5,
    )
    scheduler = BlockingScheduler(
        executors={"default": executor},
        # Every run, however late (a loaded machine): only the failover may lose one.
        job_defaults={"coalesce": False, "misfire_grace_time": 60},
        timezone="UTC",
    )
    scheduler.add_job(tick, "cron", second="*", id="tick")
    scheduler.add_listener(record, EVENT_JOB_EXECUTED)
    scheduler.start()


if __name__ == "__main__":
    main()
