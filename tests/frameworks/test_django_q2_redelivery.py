"""django-q2: a task whose worker process was killed runs when it is delivered again.

A real ``qcluster`` (ORM broker on PostgreSQL, which holds the locks too):
the worker is SIGKILLed mid-task, the cluster's guard starts another, and
the broker delivers the task again once ``retry`` (8 s here) has passed; the
new run takes the dead worker's lease over and runs to the end. Before, it
was skipped while the lease lasted (15 min here).
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.test_django_q2 import cluster, due_now, fire, results
from tests.jobs import wait_for

pytestmark = pytest.mark.databases


def test_a_task_of_a_killed_worker_runs_when_delivered_again(
    django_db_setup: None, django_db_blocker: Any, tmp_path: Path
) -> None:
    signals = tmp_path / "signals"
    signals.mkdir()
    name = f"crash-{uuid.uuid4().hex[:8]}"
    shorter = {"TASKLOCK_TEST_Q2_TIMEOUT": "6", "TASKLOCK_TEST_Q2_RETRY": "8"}
    with cluster(django_db_blocker, tmp_path / "qcluster.log", **shorter) as schedules:
        due_now(schedules, name, "crash_once", name, str(signals))
        fire()
        wait_for(signals / "first.holding")
        killed = int((signals / "first.holding").read_text())
        os.kill(killed, signal.SIGKILL)
        assert results(name, 1) == ["ran again"]
        schedules.filter(name=name).delete()
    starts = [int(pid) for pid in (signals / "starts").read_text().split()]
    assert starts[0] == killed
    assert len(starts) == 2, starts  # ran to the end exactly once more
