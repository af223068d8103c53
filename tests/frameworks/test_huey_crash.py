"""Huey: the lock of a consumer that died mid-task: freed by its ttl, or at once by proof.

Huey's own ``lock_task`` stays held until ``run_huey --flush-locks``. A module
of its own, so that its one consumer (the one killed) is alone on the queue.
A consumer stopped with SIGTERM (Huey's immediate shutdown) or killed leaves
its lease behind; the consumer started next on the same machine proves the
holder gone and runs the next task of that lock at once. Before, that task
was "not run, unable to acquire lock" for up to the ttl (15 min here).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.frameworks.test_huey import consumers, outcome
from tests.jobs import PATIENCE, wait_for

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


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_the_next_consumer_runs_the_lock_of_one_that_died_mid_task(
    tmp_path: Path, how: int
) -> None:
    from tests.jobs.huey_app import tasks

    key = f"died-{how}"
    for logs in ("first", "second"):
        (tmp_path / logs).mkdir()
    with consumers(1, tmp_path / "first") as (consumer,):
        tasks.hold_for_long(str(tmp_path), key, "interrupted")
        wait_for(tmp_path / "interrupted.holding")
        consumer.send_signal(how)
        consumer.wait(timeout=PATIENCE)
    with consumers(1, tmp_path / "second"):
        (tmp_path / "next.release").touch()
        assert outcome(tasks.hold_for_long(str(tmp_path), key, "next")) == "ran:next"
