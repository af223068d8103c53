"""RQ: the ``Retry`` of a job whose work horse was killed runs.

A real ``manage.py rqworker`` (django-rq) forks a work horse per job; the
horse is SIGKILLed mid-job, the worker counts the job failed and, with
``Retry(max=1)``, enqueues it again; the next horse takes the dead horse's
lease over and runs the job to the end. Before, the retry was skipped (the
job ended FINISHED with None and ``meta['tasklock']['skipped']``). The queue
and the locks are in Redis.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest
from django.db import connections

from tests.frameworks.test_rq import forget, outcome
from tests.jobs import wait_for
from tests.support import processes

pytestmark = pytest.mark.databases


def test_the_retry_of_a_job_whose_work_horse_was_killed_runs(tmp_path: Path) -> None:
    processes.require_module("rq")
    processes.require_module("django_rq")
    import redis
    from rq import Queue, Retry

    url = processes.redis_url()
    run = uuid.uuid4().hex[:8]
    name = f"tasklock-tests-{run}-retry"
    queue = Queue(name, connection=redis.Redis.from_url(url))
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.jobs.rq_settings",
        "TASKLOCK_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
        "TASKLOCK_TEST_REDIS_URL": url,
        "TASKLOCK_TEST_RQ_QUEUE": name,
    }
    signals = tmp_path / "signals"
    signals.mkdir()
    try:
        with processes.worker(["django", "rqworker", name], env, tmp_path / "worker.log"):
            job = queue.enqueue(
                "tests.jobs.rq_jobs.crash_once", f"{run}-crash", str(signals), retry=Retry(max=1)
            )
            wait_for(signals / "first.holding")
            horse = int((signals / "first.holding").read_text())
            os.kill(horse, signal.SIGKILL)
            assert outcome(job) == "ran again"
            job.refresh()  # type: ignore[no-untyped-call]
            assert "tasklock" not in job.meta  # not skipped
    finally:
        forget(queue)
        queue.connection.close()
    starts = [int(pid) for pid in (signals / "starts").read_text().split()]
    assert starts[0] == horse
    assert len(starts) == 2, starts  # ran to the end exactly once more, in a new horse
