"""Worker settings whose locks live where the test says: PostgreSQL or Redis.

``TASKLOCK_TEST_LOCK_STORE`` is ``postgres`` (the test's PostgreSQL database,
``TASKLOCK_TEST_LOCK_DB``) or ``redis`` (``TASKLOCK_TEST_REDIS_URL``); tasks of
django-tasks-db stay in the test's SQLite file, as in ``tests.jobs.settings``.
"""

from __future__ import annotations

import os

from tests.jobs.settings import *  # noqa: F403
from tests.jobs.settings import DATABASES
from tests.support import services

_STORE = os.environ["TASKLOCK_TEST_LOCK_STORE"]
if _STORE == "postgres":
    DATABASES["postgres"] = {
        **services.postgres_settings(os.environ[services.POSTGRES_ENV]),
        "NAME": os.environ["TASKLOCK_TEST_LOCK_DB"],
    }
    TASKLOCK_BACKEND = "database"
    TASKLOCK_DATABASE = "postgres"
elif _STORE == "redis":
    TASKLOCK_BACKEND = "redis"
    TASKLOCK_REDIS_URL = os.environ[services.REDIS_ENV]
else:
    raise ValueError(f"TASKLOCK_TEST_LOCK_STORE must be postgres or redis, not {_STORE!r}")
