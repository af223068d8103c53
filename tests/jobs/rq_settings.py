"""Settings of the ``manage.py rqworker`` processes: django-rq's queue and the Redis lock.

Queue name and Redis URL come from the test, so that runs sharing a Redis server
never take each other's jobs.
"""

from __future__ import annotations

import os

from tests.jobs.settings import *  # noqa: F403
from tests.jobs.settings import INSTALLED_APPS as BASE_APPS

INSTALLED_APPS = [*BASE_APPS, "django_rq"]
RQ_QUEUES = {
    os.environ["TASKLOCK_TEST_RQ_QUEUE"]: {"URL": os.environ["TASKLOCK_TEST_REDIS_URL"]},
}
TASKLOCK_BACKEND = "redis"
TASKLOCK_REDIS_URL = os.environ["TASKLOCK_TEST_REDIS_URL"]
