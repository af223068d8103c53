"""Celery delivers a message again: the run after a crash runs, a copy beside a live run does not.

- ``acks_late`` + ``reject_on_worker_lost``: a pool process SIGKILLed mid-task (the
  OOM killer) makes the worker reject the message, and RabbitMQ delivers it
  again; the new run takes the dead process's lease over and runs to the end.
- A Redis broker delivers a message again once its visibility timeout has
  passed, while the first copy still runs: "the same task" is no proof of
  death, and that copy is skipped; the first keeps the key and ends.

Each with a real ``celery worker`` (two pool processes); the locks in the
test's SQLite file.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from tests.frameworks.test_celery import amqp_url
from tests.jobs import PATIENCE, wait_for
from tests.support import processes

pytestmark = pytest.mark.databases


@contextlib.contextmanager
def celery_worker(
    broker: str, logs: Path, options: dict[str, Any] | None = None
) -> Iterator[Callable[..., None]]:
    """``send(task_name, *args)`` of ``tests.jobs.celery_redelivery`` on ``broker``, served
    by a worker."""
    processes.require_module("celery")
    queue = f"tasklock-redelivery-{uuid.uuid4().hex[:8]}"
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.jobs.settings",
        "TASKLOCK_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
        "TASKLOCK_TEST_BROKER": broker,
        "TASKLOCK_TEST_CELERY_QUEUE": queue,
        "TASKLOCK_TEST_BROKER_OPTIONS": json.dumps(options or {}),
    }
    os.environ.update(env)  # the tasks module reads them when first imported here
    from tests.jobs import celery_redelivery

    app = celery_redelivery.app
    app.conf.update(task_default_queue=queue, broker_transport_options=options or {})

    def send(name: str, *args: Any) -> None:
        # A connection to this broker: the app's pool may hold one to an earlier test's.
        # The queue itself, not its name: the module, imported by an earlier test of this
        # process, knows only that test's queue, and a name it does not know is declared
        # durable (the worker's non-durable declaration then fails on RabbitMQ).
        with app.connection_for_write(broker) as connection:
            task = getattr(celery_redelivery, name)
            task.apply_async(
                args, connection=connection, queue=celery_redelivery.work_queue(queue)
            )

    args = [
        "celery", "-A", "tests.jobs.celery_redelivery", "worker", "--pool=prefork",
        "--concurrency=2", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--loglevel=WARNING", f"--hostname={queue}@%h", f"--queues={queue}",
    ]  # fmt: skip
    with processes.worker(args, env, logs / "worker.log"):
        yield send


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_redelivery_after_a_killed_pool_process_runs(tmp_path: Path) -> None:
    """acks_late + reject_on_worker_lost: before, the run delivered again was skipped
    ("held by ... pid <the dead one>") and the work was lost."""
    with celery_worker(amqp_url(), tmp_path) as send:
        signals = tmp_path / "signals"
        signals.mkdir()
        send("crash_once", "crash", str(signals))
        wait_for(signals / "first.holding")
        first = int((signals / "first.holding").read_text())
        os.kill(first, signal.SIGKILL)
        wait_for(signals / "done", timeout=PATIENCE)
    starts = [int(pid) for pid in (signals / "starts").read_text().split()]
    assert starts[0] == first
    assert len(starts) == 2, starts  # ran to the end exactly once more
    assert not alive(first)  # and never beside a live copy


def test_a_copy_delivered_again_while_the_first_runs_keeps_off_the_key(tmp_path: Path) -> None:
    """Redis broker, visibility timeout 2 s: the copy is skipped, the first run ends."""
    name = uuid.uuid4().hex[:8]
    options = {
        "visibility_timeout": 2,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
        # This run's own bookkeeping, apart from any other kombu user of the database.
        "unacked_key": f"tasklock-unacked-{name}",
        "unacked_index_key": f"tasklock-unacked-index-{name}",
        "unacked_mutex_key": f"tasklock-unacked-mutex-{name}",
    }
    url = processes.redis_url()
    try:
        with celery_worker(url, tmp_path, options) as send:
            signals = tmp_path / "signals"
            signals.mkdir()
            send("outlast_visibility", "outlast", str(signals), 30)
            wait_for(signals / "done", timeout=PATIENCE)
    finally:
        import redis

        client = redis.Redis.from_url(url)
        client.delete(*(str(value) for name, value in options.items() if name.endswith("_key")))
        client.close()
    starts = (signals / "starts").read_text().split()
    skipped = (signals / "skipped").read_text().split()
    assert len(starts) == 1, starts  # the body ran once
    assert skipped, "the message was not delivered again while the first copy ran"
    assert skipped[0] != starts[0]  # the other pool process had the copy
