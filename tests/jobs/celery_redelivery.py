"""Celery tasks whose message is delivered again: after a killed pool process, or after
a Redis broker's visibility timeout while the first copy still runs.

Broker, queue and transport options come from the environment the test gives
the worker (``TASKLOCK_TEST_BROKER``, ``TASKLOCK_TEST_CELERY_QUEUE``,
``TASKLOCK_TEST_BROKER_OPTIONS`` as JSON); the locks are in the test's SQLite
file (``tests.jobs.settings``). No result backend: the tasks write signal files.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import django
from celery import Celery, shared_task
from django.apps import apps
from kombu.entity import Queue

from django_tasklock import exclusive
from tests.jobs import PATIENCE

if not apps.ready:  # in the worker; the test process has set Django up already
    django.setup()

app = Celery("tasklock_redelivery", broker=os.environ.get("TASKLOCK_TEST_BROKER", "memory://"))


def work_queue(name: str) -> Queue:
    """The queue a test's worker consumes and its messages are sent to: declared alike by
    both sides (a name alone is declared durable by the sender, and RabbitMQ then refuses
    the worker's declaration)."""
    return Queue(name, durable=False, auto_delete=True)


queue = os.environ.get("TASKLOCK_TEST_CELERY_QUEUE", "tasklock-redelivery")
app.conf.update(
    task_default_queue=queue,
    task_queues=[work_queue(queue)],
    broker_transport_options=json.loads(os.environ.get("TASKLOCK_TEST_BROKER_OPTIONS", "{}")),
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)


def started(signals: str) -> int:
    """Note that a body started (``starts``: one pid a line); how many have, this one included."""
    with (Path(signals) / "starts").open("a") as starts:
        starts.write(f"{os.getpid()}\n")
    return len((Path(signals) / "starts").read_text().split())


@shared_task(acks_late=True, reject_on_worker_lost=True)
@exclusive("celery-redelivery:{key}", ttl=900)
def crash_once(key: str, signals: str) -> str:
    """The first run waits to be killed (the OOM killer, say); the one delivered again ends."""
    if started(signals) == 1:
        (Path(signals) / "first.holding").write_text(str(os.getpid()))
        time.sleep(PATIENCE)
        raise TimeoutError("the first run was not killed")
    (Path(signals) / "done").write_text(str(os.getpid()))
    return "ran again"


def note_skipped(key: str, signals: str, seconds: float) -> None:
    """``on_locked`` of :func:`outlast_visibility`: the copy delivered again found the key held."""
    with (Path(signals) / "skipped").open("a") as skipped:
        skipped.write(f"{os.getpid()}\n")


@shared_task(acks_late=True)
@exclusive("celery-redelivery:{key}", ttl=900, on_locked=note_skipped)
def outlast_visibility(key: str, signals: str, seconds: float) -> str:
    """Run ``seconds``, longer than the broker's visibility timeout: delivered again meanwhile."""
    started(signals)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (Path(signals) / "skipped").exists():
        time.sleep(0.1)
    time.sleep(1)  # still holding the key a while after the copy was skipped
    (Path(signals) / "done").write_text(str(os.getpid()))
    return "ran"
