"""A Celery app with one entry due every whole second, for ``celery beat`` and a worker.

The test starts several ``celery beat --scheduler
django_tasklock.contrib.celery:LeaderScheduler`` processes on this app and one
worker. Each run of ``tick`` records, in a Redis list of the test's, the second
it was due for, the beat process that sent it and when it was sent, and the
sending beat's last look at its leadership (the ``poll()`` before each tick):
when it began, how long it took, and the term it found (``leader_since``).
"""

from __future__ import annotations

import math
import os
import time
from datetime import datetime, timedelta
from typing import Any

import django
import redis
from celery import Celery, schedules, shared_task
from celery.signals import before_task_publish
from django.apps import apps
from kombu.entity import Queue

if not apps.ready:
    django.setup()

from django_tasklock.api.leadership import Leadership

app = Celery("tasklock_beat_tests", broker=os.environ.get("TASKLOCK_TEST_AMQP_URL", "memory://"))
queue = os.environ.get("TASKLOCK_TEST_CELERY_QUEUE", "tasklock-beat-tests")
TICKS = os.environ.get("TASKLOCK_TEST_TICKS", "tasklock-beat-tests:ticks")


class EverySecond(schedules.schedule):
    """Due at every whole second (UTC) after the entry's last run; one run per due call.

    Like Celery's crontab, runs missed while beat was late collapse into one.
    """

    def __init__(self) -> None:
        super().__init__(run_every=timedelta(seconds=1), app=app)

    def is_due(self, last_run_at: datetime) -> schedules.schedstate:
        due_at = math.floor(last_run_at.timestamp()) + 1
        now = time.time()
        if now < due_at:
            return schedules.schedstate(False, due_at - now)
        global _due
        _due = due_at  # what the next message sent is for (beat is single-threaded)
        return schedules.schedstate(True, math.floor(now) + 1 - now)

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return timedelta(seconds=math.floor(last_run_at.timestamp()) + 1 - time.time())

    def __reduce__(self) -> Any:
        return (self.__class__, ())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EverySecond)

    __hash__ = object.__hash__


_due: int | None = None
_look = (0.0, 0.0, 0.0)  # this beat's last poll(): began at, took, leader_since (0: none)

_poll = Leadership.poll


def _timed_poll(self: Leadership) -> bool:
    """``Leadership.poll``, timed: what made a run late, beat or its look at the key?"""
    global _look
    began = time.time()
    try:
        return _poll(self)
    finally:
        since = self.leader_since
        _look = (began, time.time() - began, since.timestamp() if since else 0.0)


Leadership.poll = _timed_poll  # type: ignore[method-assign]

app.conf.update(
    task_default_queue=queue,
    task_queues=[Queue(queue, durable=False, auto_delete=True)],
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    timezone="UTC",
    enable_utc=True,
    beat_schedule={"tick": {"task": "tests.jobs.celery_beat.tick", "schedule": EverySecond()}},
    tasklock_beat_key=os.environ.get("TASKLOCK_TEST_BEAT_KEY", "beat-tests"),
    tasklock_beat_ttl=float(os.environ.get("TASKLOCK_TEST_BEAT_TTL", "6")),
    tasklock_beat_retry_interval=0.5,
)


@before_task_publish.connect
def _stamp(body: Any, **kwargs: Any) -> None:
    """In beat: say which second this run was due for, who sent it and when."""
    if _due is not None:
        looked, look, term = _look
        body[1].update(
            due=_due, beat=os.getpid(), sent=time.time(), looked=looked, look=look, term=term
        )


@shared_task
def tick(
    due: int = 0,
    beat: int = 0,
    sent: float = 0.0,
    looked: float = 0.0,
    look: float = 0.0,
    term: float = 0.0,
) -> None:
    client = redis.Redis.from_url(os.environ["TASKLOCK_TEST_REDIS_URL"])
    client.rpush(TICKS, f"{due} {beat} {sent:.3f} {looked:.3f} {look:.4f} {term:.6f}")
    client.close()
