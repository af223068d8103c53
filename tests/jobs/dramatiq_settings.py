"""Settings of the ``dramatiq`` worker processes: django-dramatiq's broker on Redis.

The Redis namespace and queue come from the test, so that runs sharing a Redis
server never take each other's messages; the locks are in the test's SQLite file.
"""

from __future__ import annotations

import os

from tests.jobs.settings import *  # noqa: F403
from tests.jobs.settings import INSTALLED_APPS as BASE_APPS

INSTALLED_APPS = [*BASE_APPS, "django_dramatiq"]
DRAMATIQ_BROKER = {
    "BROKER": "dramatiq.brokers.redis.RedisBroker",
    "OPTIONS": {
        "url": os.environ["TASKLOCK_TEST_REDIS_URL"],
        "namespace": os.environ["TASKLOCK_TEST_DRAMATIQ_NAMESPACE"],
        # A worker silent this long is dead, and its messages delivered again,
        # looked for at every command (tests/frameworks/test_dramatiq_redelivery.py).
        **(
            {
                "heartbeat_timeout": int(os.environ["TASKLOCK_TEST_DRAMATIQ_HEARTBEAT_MS"]),
                "maintenance_chance": 1_000_000,
            }
            if "TASKLOCK_TEST_DRAMATIQ_HEARTBEAT_MS" in os.environ
            else {}
        ),
    },
    "MIDDLEWARE": [
        "dramatiq.middleware.TimeLimit",
        "dramatiq.middleware.Retries",
        "django_dramatiq.middleware.DbConnectionsMiddleware",
        "django_tasklock.contrib.dramatiq.TaskLock",
        "tests.jobs.dramatiq_skips.RecordSkips",
    ],
}
