"""Settings of the ``run_huey`` consumers: the workers' settings, plus djhuey and its tasks.

The queue's name and Redis URL come from the test, so that each run has a
queue of its own on the shared Redis server.
"""

from __future__ import annotations

import os

from tests.jobs.settings import *  # noqa: F403
from tests.jobs.settings import INSTALLED_APPS as WORKER_APPS

INSTALLED_APPS = [*WORKER_APPS, "huey.contrib.djhuey", "tests.jobs.huey_app"]
HUEY = {
    "name": os.environ["TASKLOCK_TEST_HUEY_NAME"],
    "url": os.environ["TASKLOCK_TEST_REDIS_URL"],
    "immediate": False,
    "results": True,
}
