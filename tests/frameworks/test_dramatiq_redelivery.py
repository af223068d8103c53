"""Dramatiq: a message whose worker process was killed runs when it is delivered again.

``dramatiq`` (django-dramatiq's setup, one process, one thread) on a Redis
broker that counts a worker dead once it has been silent for 3 s: the
worker process is SIGKILLed mid-message, the dramatiq instance stops, a new
one starts and, the dead worker silent, delivers its message again; the new
run takes the dead process's lease over and runs to the end. Before, it was
skipped while the lease lasted (15 min here). The locks in the test's SQLite file.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from tests.jobs import PATIENCE, wait_for
from tests.support import processes

pytestmark = pytest.mark.databases


def test_a_message_of_a_killed_worker_runs_when_delivered_again(tmp_path: Path) -> None:
    processes.require_module("dramatiq")
    processes.require_module("django_dramatiq")
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    run = uuid.uuid4().hex[:8]
    url, namespace, queue = processes.redis_url(), f"tasklock-tests-{run}", f"tasklock-tests-{run}"
    broker = RedisBroker(url=url, namespace=namespace, middleware=[])  # type: ignore[no-untyped-call]
    broker.declare_queue(queue)
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.jobs.dramatiq_settings",
        "TASKLOCK_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
        "TASKLOCK_TEST_REDIS_URL": url,
        "TASKLOCK_TEST_DRAMATIQ_NAMESPACE": namespace,
        "TASKLOCK_TEST_DRAMATIQ_QUEUE": queue,
        "TASKLOCK_TEST_DRAMATIQ_HEARTBEAT_MS": "3000",
        "dramatiq_queue_prefetch": "1",
    }
    args = [
        "dramatiq", "django_dramatiq.setup", "tests.jobs.dramatiq_actors",
        "--processes=1", "--threads=1", "--worker-shutdown-timeout=5000",
    ]  # fmt: skip
    signals = tmp_path / "signals"
    signals.mkdir()
    try:
        with processes.worker(args, env, tmp_path / "first.log") as first_instance:
            message: Any = dramatiq.Message(
                queue_name=queue,
                actor_name="crash_once",
                args=(f"{run}-crash", str(signals)),
                kwargs={},
                options={},
            )
            broker.enqueue(message)
            wait_for(signals / "first.holding")
            killed = int((signals / "first.holding").read_text())
            os.kill(killed, signal.SIGKILL)
            first_instance.wait(PATIENCE)  # one worker gone: dramatiq stops the rest
        with processes.worker(args, env, tmp_path / "second.log"):
            wait_for(signals / "done")
    finally:
        for stored in broker.client.scan_iter(f"{namespace}:*"):
            broker.client.delete(stored)
        broker.close()
    starts = [int(pid) for pid in (signals / "starts").read_text().split()]
    assert starts[0] == killed
    assert len(starts) == 2, starts  # ran to the end exactly once more
