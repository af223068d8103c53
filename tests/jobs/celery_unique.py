"""Celery tasks with ``unique_on=`` for the worker test_unique_celery.py starts.

Each run appends its pid to ``<signals>/<name>.runs``; the holding tasks then
wait for the test's ``<name>.release`` file (see ``tests.jobs.hold``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import django
from celery import Celery, shared_task
from django.apps import apps
from kombu.entity import Queue

from django_tasklock.contrib.celery import UniqueTask
from tests.jobs import hold, ran, wait_for

if not apps.ready:
    django.setup()

app = Celery("tasklock_unique_tests", broker=os.environ.get("TASKLOCK_TEST_AMQP_URL", "memory://"))
queue = os.environ.get("TASKLOCK_TEST_CELERY_QUEUE", "tasklock-unique-tests")
app.conf.update(
    task_default_queue=queue,
    # Not auto_delete: one queue serves the test's workers in turn; the test deletes it.
    task_queues=[Queue(queue, durable=False)],
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)


@shared_task(base=UniqueTask, unique_on="unique:{name}", unique_ttl=60)
def hold_unique(name: str, signals: str) -> str:
    ran(name, signals)
    return hold(name, signals)


@shared_task(base=UniqueTask, unique_on="unique:{name}", unique_ttl=3)
def hold_briefly_keyed(name: str, signals: str) -> str:
    """``unique_ttl=3``: killed, its worker frees the key within 3 s."""
    ran(name, signals)
    return hold(name, signals)


@shared_task(base=UniqueTask, unique_on="unique:{name}", unique_ttl=60)
def fail_unique(name: str, signals: str) -> None:
    ran(name, signals)
    raise ValueError(f"{name} fails")


@shared_task(bind=True, base=UniqueTask, unique_on="unique:{name}", unique_ttl=60, max_retries=1)
def retry_unique(self: Any, name: str, signals: str) -> str:
    """Asks for one retry (``self.retry()``), then returns."""
    ran(name, signals)
    if self.request.retries == 0:
        raise self.retry(countdown=0)
    return f"ran:{name}:attempt {self.request.retries}"


@shared_task(bind=True, base=UniqueTask, unique_on="unique:{name}", unique_ttl=60, max_retries=1)
def retry_slowly(self: Any, name: str, signals: str) -> str:
    """Asks for one retry at once, then takes its time to end (the retry may start
    meanwhile, in the other worker process); the retry holds until released."""
    ran(name, signals)
    if self.request.retries == 0:
        try:
            raise self.retry(countdown=0)
        finally:
            wait_for(Path(signals) / f"{name}.holding")  # the retry runs, in the other process
            time.sleep(0.5)
    return hold(name, signals)
