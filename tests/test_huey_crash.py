"""Huey: the lock of a consumer killed mid-task frees itself when its lease ends.

Huey's own ``lock_task`` stays held until ``run_huey --flush-locks``. A module
of its own, so that its one consumer (the one killed) is alone on the queue.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.jobs import PATIENCE, wait_for
from tests.test_huey import consumers

pytestmark = pytest.mark.databases


def test_a_killed_consumers_lock_is_free_once_its_lease_ends(tmp_path: Path) -> None:
    with consumers(1, tmp_path) as (consumer,):
        from django_tasklock.contrib.huey import lock_task
        from tests.jobs.huey_app import tasks

        tasks.hold_briefly(str(tmp_path), "crash", "crashed")
        wait_for(tmp_path / "crashed.holding")
        consumer.send_signal(signal.SIGKILL)
        consumer.wait(timeout=PATIENCE)
        name = tasks.lock_name("crash")
        assert lock_task(name).is_locked()  # nobody refreshes it, nobody released it
        deadline = time.monotonic() + PATIENCE
        while lock_task(name).is_locked():  # the lease (ttl 4 s) runs out
            assert time.monotonic() < deadline, f"{name} still held"
            time.sleep(0.1)
        with lock_task(name):  # and anyone may take it
            pass
